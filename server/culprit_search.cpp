#include "culprit_search.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace orochi::server {
namespace {

std::string Listed(const std::vector<std::string>& keys) {
  std::string text;
  for (const std::string& key : keys) text += (text.empty() ? "" : ",") + key;
  return text;
}

bool Contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

CulpritSearch::Step CulpritSearch::NoteUnnamedDeath(Clock::time_point now,
                                                    const std::vector<std::string>& loaded,
                                                    std::chrono::milliseconds lifetime,
                                                    const std::string& load_in_flight) {
  if (searching_) {
    switch (phase_) {
      case Phase::kHalving: {
        // It died with held_back_ held back: the culprit is among what it loaded. (A suspect
        // whose load had not begun yet cannot have caused it either.)
        std::vector<std::string> left;
        for (const std::string& suspect : suspects_) {
          if (held_back_.count(suspect) == 0 && Contains(loaded, suspect)) left.push_back(suspect);
        }
        return Narrow(std::move(left), "it died naming no model while they were loaded");
      }
      case Phase::kWithoutLast: {
        const std::string because = "it died naming no model with " + suspects_.front() +
                                    " held back, and these loaded before it";
        std::vector<std::string> left;
        if (!reserve_.empty()) {
          for (const std::string& suspect : std::exchange(reserve_, {})) {
            if (Contains(loaded, suspect)) left.push_back(suspect);
          }
          return Narrow(std::move(left), because);
        }
        // The deaths go on without it: another model's doing (two culprits), or none's. It
        // stays held back, set aside, while the search goes on among what that start loaded;
        // once nothing is left there, the deaths are no model's.
        const std::string last = suspects_.front();
        set_aside_.insert(last);
        for (const std::string& key : loaded) {
          if (set_aside_.count(key) == 0 && !Contains(left, key)) left.push_back(key);
        }
        return Narrow(std::move(left), "it died naming no model with " + last +
                                           " held back, which is set aside, held back while "
                                           "the search looks among the models loaded");
      }
      case Phase::kWithLast: {
        const std::string& last = suspects_.front();
        if (!Contains(loaded, last)) {
          return NothingFound("it died naming no model before " + last + " was loaded");
        }
        Step step;
        step.what = "the search for the model behind deaths naming none found " + last +
                    ": the serving process served without it, and died so again with it";
        step.culprit = last;
        End();
        return step;
      }
    }
  }
  deaths_.emplace_back(now, lifetime);
  while (!deaths_.empty() && now - deaths_.front().first > settings_.window) deaths_.pop_front();
  if (static_cast<int64_t>(deaths_.size()) < settings_.deaths_to_start || loaded.empty()) {
    return {};
  }
  std::chrono::milliseconds longest{0};
  for (const auto& death : deaths_) longest = std::max(longest, death.second);
  deaths_.clear();
  trial_ = std::clamp(std::chrono::ceil<std::chrono::seconds>(4 * longest),
                      settings_.shortest_trial, settings_.longest_trial);
  searching_ = true;
  std::vector<std::string> suspects;
  for (const std::string& key : loaded) {
    if (key == load_in_flight) break;  // what loaded after it cannot have caused its death
    if (!Contains(suspects, key)) suspects.push_back(key);  // each version once, in load order
  }
  Step step;
  if (load_in_flight.empty()) {
    step = Narrow(std::move(suspects), "the last start loaded them");
  } else {
    step = Narrow({load_in_flight}, "the last death came as it loaded");
    reserve_ = std::move(suspects);
  }
  step.what = "the serving process died " + std::to_string(settings_.deaths_to_start) +
              " times with no crash record naming a model; looking for the model behind it by "
              "holding models back in turn (trial " +
              std::to_string(trial_.count()) + " s): " + step.what;
  return step;
}

CulpritSearch::Step CulpritSearch::NoteServing(std::chrono::milliseconds served_for) {
  if (!searching_ || served_for < trial_) return {};
  const std::string served = "it served " + std::to_string(trial_.count()) + " s";
  Step step;
  switch (phase_) {
    case Phase::kHalving: {
      std::vector<std::string> left;  // in load order, as the suspects are kept
      for (const std::string& suspect : suspects_) {
        if (held_back_.count(suspect) != 0) left.push_back(suspect);
      }
      if (left.size() != 1) {
        step = Narrow(std::move(left), served + " without them");
        break;
      }
      // Held back alone, and served: that was kWithoutLast's trial already.
      suspects_ = std::move(left);
    }
      [[fallthrough]];
    case Phase::kWithoutLast:
      phase_ = Phase::kWithLast;
      held_back_ = set_aside_;
      step.what = "the search for the model behind deaths naming none: " + served + " without " +
                  suspects_.front() + "; loading it again to see the deaths come back";
      break;
    case Phase::kWithLast:
      return NothingFound(served + " with every model loaded: the deaths stopped on their own");
  }
  // The held-back set changed under a serving process started with the old one.
  step.restart = true;
  return step;
}

CulpritSearch::Step CulpritSearch::Excuse(const std::string& model_key) {
  if (!searching_ || held_back_.erase(model_key) == 0) return {};
  set_aside_.erase(model_key);
  suspects_.erase(std::remove(suspects_.begin(), suspects_.end(), model_key), suspects_.end());
  if (suspects_.empty() || phase_ == Phase::kWithoutLast) {
    return NothingFound("an operator loaded " + model_key + ", the last suspect");
  }
  Step step;
  step.what = "the search for the model behind deaths naming none: an operator loaded " +
              model_key + ", which is no suspect any more; suspects " + Listed(suspects_);
  return step;
}

CulpritSearch::Step CulpritSearch::Narrow(std::vector<std::string> left,
                                          const std::string& because) {
  if (left.empty()) return NothingFound("no suspect is left: " + because);
  suspects_ = std::move(left);
  held_back_ = set_aside_;
  Step step;
  if (suspects_.size() == 1) {
    phase_ = Phase::kWithoutLast;
    held_back_.insert(suspects_.front());
    step.what = "the search for the model behind deaths naming none: one suspect is left (" +
                because + "); holding back " + suspects_.front() + " alone";
    return step;
  }
  phase_ = Phase::kHalving;
  const auto half = static_cast<std::ptrdiff_t>((suspects_.size() + 1) / 2);
  const std::vector<std::string> holding(suspects_.begin(), suspects_.begin() + half);
  held_back_.insert(holding.begin(), holding.end());
  step.what = "the search for the model behind deaths naming none: suspects " + Listed(suspects_) +
              " (" + because + "); holding back " + Listed(holding);
  return step;
}

CulpritSearch::Step CulpritSearch::NothingFound(const std::string& because) {
  Step step;
  step.what = "the search for the model behind deaths naming none ends with nothing found (" +
              because + "): the deaths are not one model's doing";
  End();
  return step;
}

void CulpritSearch::End() {
  searching_ = false;
  phase_ = Phase::kHalving;
  suspects_.clear();
  reserve_.clear();
  set_aside_.clear();
  held_back_.clear();
}

}  // namespace orochi::server
