// The supervisor's search for the model behind deaths that name none.
//
// Most deaths of the serving process name their model: a crash record, or the load in flight at
// a start. Some cannot: model code can kill its process from a thread the server never marked
// (a thread started with the C library's own pthread_create), leave it unable to answer (its
// descriptors used up or replaced), or damage state that the server's own code trips over
// later. Restarted at once each time, such a package kept every other model down with it, and
// nothing was quarantined.
//
// A death with no record while a start loads a model is put on that load, but only as a
// suspicion: an earlier model's code may have damaged what every load uses (the interpreter
// the models of a copy share, say), and innocent models were once quarantined in turn while
// the guilty one served.
//
// When such deaths come `deaths_to_start` times within `window`, the search begins. If the
// last was at a load, that version is tried first, alone (below), with the versions loaded
// before it kept in reserve: the suspects if the deaths go on without it. Otherwise the
// versions the last start loaded are the suspects, and the search has the supervisor
// hold half of them back at each start (not loaded; UNAVAILABLE with why). A serving process
// that still dies that way clears what was held back; one that serves for the trial clears
// what it loaded. The one suspect left is then tried both ways: held back alone, the serving
// process must serve for the trial; loaded again, it must die so again. Only then is it the
// culprit, to quarantine. If the deaths go on without it, it is set aside (still held back)
// and the search goes on among the models that start loaded: two culprits are found one after
// the other, the second by a search of its own once the first is quarantined. Deaths that go
// on whatever is held back (the server's own, an operator's kill -9 each start), or that stop
// on their own, end the search with nothing found, holding nothing back.
//
// The trial is four times the longest life among the deaths that began the search (within
// `shortest_trial` and `longest_trial`), so that a package that kills its process some seconds
// after each start is still there when its turn comes. What the search cannot tell apart: a
// culprit that picks its moments (kills after the trial, or only while a given model is held
// back) may have an innocent model quarantined, which an explicit load lifts. An explicit load
// of a model held back excuses it (Excuse).
//
// Driven by the supervisor's one loop; not thread-safe. Keeps no clock of its own: the
// supervisor passes the time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace orochi::server {

class CulpritSearch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Settings {
    int64_t deaths_to_start = 3;       // supervisor.max_model_crashes
    std::chrono::seconds window{600};  // supervisor.crash_window_s
    std::chrono::seconds shortest_trial{10};
    std::chrono::seconds longest_trial{600};
  };

  // What the supervisor is to do after a step.
  struct Step {
    // A line for the log saying what the search did, empty when it did nothing.
    std::string what;
    // Found: to quarantine.
    std::optional<std::string> culprit;
    // The models to hold back changed while a serving process runs with the old set: restart
    // it to apply them.
    bool restart = false;
  };

  explicit CulpritSearch(Settings settings) : settings_(settings) {}

  // A serving process that began to load `loaded` (model versions, "name:version", in load
  // order) with held_back() held back, and lived `lifetime`, died in a way that named no model;
  // at a start, with no crash record, while `load_in_flight` (the last of `loaded`) loaded,
  // where that is not empty.
  Step NoteUnnamedDeath(Clock::time_point now, const std::vector<std::string>& loaded,
                        std::chrono::milliseconds lifetime, const std::string& load_in_flight = {});
  // The serving process started with held_back() held back has served for `served_for` without
  // dying: past the trial, what it loaded is cleared.
  Step NoteServing(std::chrono::milliseconds served_for);
  // An operator loaded `model_key`, which the search held back: it is no suspect any more (the
  // search may end so). Not an end of the search: a "lifted" line naming a model held back is
  // one model code can forge, to keep the search from finding it.
  Step Excuse(const std::string& model_key);

  bool searching() const { return searching_; }
  // The model versions the next serving process is to leave unloaded.
  const std::set<std::string>& held_back() const { return held_back_; }
  // Those that may still be the culprit.
  const std::vector<std::string>& suspects() const { return suspects_; }
  std::chrono::seconds trial() const { return trial_; }

 private:
  enum class Phase {
    kHalving,      // half the suspects held back at each start
    kWithoutLast,  // the last suspect held back alone: the process must serve for the trial
    kWithLast,     // and loaded again: it must die naming no model
  };

  // Narrows the suspects to `left`, which a start showed `because`: the halving goes on, or
  // the last one is tried (kWithoutLast), or nothing is left.
  Step Narrow(std::vector<std::string> left, const std::string& because);
  // Ends the search with nothing found, saying why.
  Step NothingFound(const std::string& because);
  void End();

  const Settings settings_;
  // Deaths that named no model, with the lives that ended, within the window (before a search).
  std::deque<std::pair<Clock::time_point, std::chrono::milliseconds>> deaths_;
  bool searching_ = false;
  Phase phase_ = Phase::kHalving;
  std::vector<std::string> suspects_;
  // With the load in flight tried first (kWithoutLast): the versions loaded before it.
  std::vector<std::string> reserve_;
  // Last suspects without which the deaths went on: held back while the search looks among
  // the other models (a second culprit), released when it ends.
  std::set<std::string> set_aside_;
  std::set<std::string> held_back_;
  std::chrono::seconds trial_{0};
};

}  // namespace orochi::server
