// `orochi serve` as two processes: a small supervisor that holds the listening sockets, and the
// serving process (Server) that holds the interpreter copies and the models.
//
// Copies share one process, so a native crash in any model's code (a C extension's bug, ctypes
// reading address 0, a C stack overflowed) ends every copy at once. The supervisor binds the
// ports, forks the serving process with them, and when it dies of a signal or exits
// unbidden, restarts it on the same sockets: clients wait in the listen backlog or see one
// reset connection, never a closed port. The dying process writes a crash record naming the
// signal and the model and copy that crashed (crash_record.h); the supervisor logs it, counts
// it for the metrics of the next serving process (orochi_server_restarts_total,
// orochi_model_crashes_total{model}), and once a model version has crashed the process
// `max_model_crashes` times within `crash_window_s`, quarantines it: the next serving process
// starts without it (UNAVAILABLE in the index, with the reason), so that a crash loop cannot
// keep everything else down. Loading it explicitly, or deploying another version, lifts that.
// Deaths that name no model, as often, start a search that holds models back in turn to find
// the one behind them (culprit_search.h), quarantined alike.
//
// The supervisor forks before it starts any thread of its own and never loads a copy, so each
// fork starts the serving process from a clean, single-threaded state. SIGTERM and SIGINT are
// passed to the serving process, whose graceful shutdown decides the exit status. A serving
// process that fails before it is ready the first time (a bad config, a model that does not
// load) ends the supervisor with its status, as a single process would.
#pragma once

#include "orochi/base/status.h"
#include "orochi/server/config.h"

namespace orochi::server {

// Binds the configured ports and serves with restarts until stopped; returns the exit status.
// An error before the first serving process starts (a port that cannot be bound) is a Status.
Result<int> RunSupervised(ServerConfig config);

}  // namespace orochi::server
