// The supervisor's search for the model behind deaths that name none.
//
// Most deaths of the serving process name their model: a crash record, or the load in flight at
// a start. Some cannot: model code can kill its process from a thread the server never marked
// (a thread started with the C library's own pthread_create), leave it unable to answer (its
// descriptors used up or replaced), or damage state that the server's own code trips over
// later. Restarted at once each time, such a package kept every other model down with it, and
// nothing was quarantined.
//
// When deaths that name no model come `deaths_to_start` times within `window`, the search
// begins with the model versions the last start loaded as suspects, and has the supervisor
// hold half of them back at each start (not loaded; UNAVAILABLE with why). A serving process
// that still dies that way clears what was held back; one that serves for the trial clears
// what it loaded. The one suspect left is then tried both ways: held back alone, the serving
// process must serve for the trial; loaded again, it must die so again. Only then is it the
// culprit, to quarantine. Otherwise the deaths are not one model's doing (the server's own, an
// operator's kill -9, two culprits, deaths that stopped on their own), and the search ends
// with nothing found, holding nothing back.
//
// The trial is four times the longest life among the deaths that began the search (within
// `shortest_trial` and `longest_trial`), so that a package that kills its process some seconds
// after each start is still there when its turn comes. What the search cannot tell apart: a
// culprit that picks its moments (kills after the trial, or only while a given model is held
// back) may have an innocent model quarantined, which an explicit load lifts.
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
    int64_t deaths_to_start = 3;  // supervisor.max_model_crashes
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
  // order) with held_back() held back, and lived `lifetime`, died in a way that named no model.
  Step NoteUnnamedDeath(Clock::time_point now, const std::vector<std::string>& loaded,
                        std::chrono::milliseconds lifetime);
  // The serving process started with held_back() held back has served for `served_for` without
  // dying: past the trial, what it loaded is cleared.
  Step NoteServing(std::chrono::milliseconds served_for);
  // Ends the search, holding nothing back (an operator loaded a model it held back).
  void Abandon() { End(); }

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
  std::set<std::string> held_back_;
  std::chrono::seconds trial_{0};
};

}  // namespace orochi::server
