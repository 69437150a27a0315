#include "culprit_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace orochi::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const std::vector<std::string> kModels = {"a:1", "b:1", "c:1", "d:1", "e:1"};

CulpritSearch::Settings Settings() {
  return {.deaths_to_start = 3,
          .window = seconds(600),
          .shortest_trial = seconds(10),
          .longest_trial = seconds(600)};
}

// What a start loads: every model but those held back.
std::vector<std::string> Loaded(const CulpritSearch& search) {
  std::vector<std::string> loaded;
  for (const std::string& model : kModels) {
    if (search.held_back().count(model) == 0) loaded.push_back(model);
  }
  return loaded;
}

// Three deaths of starts that loaded `loaded` and lived `life` each, a second apart: what begins
// a search.
void Begin(CulpritSearch& search, CulpritSearch::Clock::time_point& now,
           const std::vector<std::string>& loaded, milliseconds life,
           const std::string& load_in_flight = {}) {
  for (int death = 0; death < 3; ++death) {
    EXPECT_FALSE(search.NoteUnnamedDeath(now += seconds(1), loaded, life, load_in_flight).culprit);
  }
  EXPECT_TRUE(search.searching());
}

// Steps `search` with `restart` (a start's outcome) until it ends, finding nobody; the last step.
template <typename Restart>
CulpritSearch::Step RunToTheEnd(CulpritSearch& search, Restart restart) {
  CulpritSearch::Step step;
  for (int restarts = 0; restarts < 40 && search.searching(); ++restarts) {
    step = restart();
    EXPECT_FALSE(step.culprit);
  }
  EXPECT_FALSE(search.searching());
  EXPECT_TRUE(search.held_back().empty());
  return step;
}

// Runs the supervisor's side of a search against a culprit that kills each start that loads it
// two seconds in; the model quarantined, and how many restarts it took.
std::pair<std::string, int> Find(const std::string& culprit) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  for (int death = 0; death < 3; ++death) {
    now += seconds(3);
    EXPECT_FALSE(search.searching());
    CulpritSearch::Step step = search.NoteUnnamedDeath(now, kModels, milliseconds(2500));
    EXPECT_FALSE(step.culprit);
  }
  EXPECT_TRUE(search.searching());
  EXPECT_EQ(search.trial(), seconds(10));
  for (int restarts = 1; restarts < 20; ++restarts) {
    const std::vector<std::string> loaded = Loaded(search);
    CulpritSearch::Step step;
    if (std::find(loaded.begin(), loaded.end(), culprit) != loaded.end()) {
      now += seconds(3);
      EXPECT_FALSE(search.NoteServing(milliseconds(1500)).restart);
      step = search.NoteUnnamedDeath(now, loaded, milliseconds(2500));
    } else {
      step = search.NoteServing(search.trial());
    }
    EXPECT_FALSE(step.what.empty());
    if (step.culprit) {
      EXPECT_FALSE(search.searching());
      EXPECT_TRUE(search.held_back().empty());
      return {*step.culprit, restarts};
    }
    EXPECT_TRUE(search.searching());
  }
  return {"", 0};
}

TEST(CulpritSearch, FindsEachModelInLogTwoOfTheSuspectsStepsAndTwoMore) {
  for (const std::string& culprit : kModels) {
    const auto [found, steps] = Find(culprit);
    EXPECT_EQ(found, culprit);
    EXPECT_LE(steps, 3 + 2) << culprit;  // ceil(log2(5)), then the last one tried both ways
  }
}

TEST(CulpritSearch, DeathsThatStopOnTheirOwnQuarantineNobody) {
  // An operator's kill -9 three times, say: the trials pass whatever is held back.
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  Begin(search, now, kModels, milliseconds(4000));
  const CulpritSearch::Step step =
      RunToTheEnd(search, [&] { return search.NoteServing(search.trial()); });
  EXPECT_NE(step.what.find("stopped on their own"), std::string::npos) << step.what;
}

TEST(CulpritSearch, TheLoadInFlightIsTriedFirstAlone) {
  // A package that kills each start as it loads: three deaths put on its load, then one start
  // without it and one with it.
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  const std::vector<std::string> loaded = {"a:1", "b:1", "c:1"};
  Begin(search, now, loaded, milliseconds(900), "c:1");
  EXPECT_EQ(search.held_back(), std::set<std::string>{"c:1"});
  EXPECT_TRUE(search.NoteServing(search.trial()).restart);
  EXPECT_TRUE(search.held_back().empty());
  const CulpritSearch::Step step =
      search.NoteUnnamedDeath(now += seconds(1), loaded, milliseconds(900), "c:1");
  ASSERT_TRUE(step.culprit);
  EXPECT_EQ(*step.culprit, "c:1");
}

TEST(CulpritSearch, DeathsAtAnInnocentsLoadFindTheModelLoadedBeforeThatCausedThem) {
  // a:1, loaded first, damages what every load after it uses: each start dies at the next
  // load, whichever that is. Innocent models were once quarantined in turn.
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  // The models the serving process loads with those held back, up to the load it dies at:
  // the first after a:1, or none if a:1 is held back.
  auto start = [&]() -> std::pair<std::vector<std::string>, std::string> {
    std::vector<std::string> loaded;
    bool damaged = false;
    for (const std::string& model : kModels) {
      if (search.held_back().count(model) != 0) continue;
      loaded.push_back(model);
      if (damaged) return {loaded, model};
      damaged = model == "a:1";
    }
    return {loaded, ""};
  };
  for (int death = 0; death < 3; ++death) {
    const auto [loaded, dying] = start();
    EXPECT_EQ(dying, "b:1");
    search.NoteUnnamedDeath(now += seconds(1), loaded, milliseconds(900), dying);
  }
  for (int restarts = 0; restarts < 12 && search.searching(); ++restarts) {
    const auto [loaded, dying] = start();
    const CulpritSearch::Step step =
        dying.empty()
            ? search.NoteServing(search.trial())
            : search.NoteUnnamedDeath(now += seconds(1), loaded, milliseconds(900), dying);
    if (step.culprit) {
      EXPECT_EQ(*step.culprit, "a:1");
      return;
    }
  }
  FAIL() << "not found";
}

TEST(CulpritSearch, TwoCulpritsAreFoundOneAfterTheOther) {
  // b and e each kill every start that loads them: each search once ended with nothing found,
  // and a new one began three deaths later, for good.
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  std::set<std::string> quarantined;
  for (int restarts = 0; restarts < 60 && quarantined.size() < 2; ++restarts) {
    std::vector<std::string> loaded;
    for (const std::string& model : kModels) {
      if (quarantined.count(model) == 0 && search.held_back().count(model) == 0) {
        loaded.push_back(model);
      }
    }
    const bool dies = std::find(loaded.begin(), loaded.end(), "b:1") != loaded.end() ||
                      std::find(loaded.begin(), loaded.end(), "e:1") != loaded.end();
    const CulpritSearch::Step step =
        dies ? search.NoteUnnamedDeath(now += seconds(2), loaded, milliseconds(900))
             : search.NoteServing(search.trial());
    EXPECT_EQ(step.what.find("nothing found"), std::string::npos) << step.what;
    if (step.culprit) quarantined.insert(*step.culprit);
  }
  EXPECT_EQ(quarantined, (std::set<std::string>{"b:1", "e:1"}));
}

TEST(CulpritSearch, DeathsOutsideTheWindowStartNothing) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  for (int death = 0; death < 5; ++death) {
    now += seconds(400);
    search.NoteUnnamedDeath(now, kModels, milliseconds(2000));
    EXPECT_FALSE(search.searching()) << death;
  }
}

TEST(CulpritSearch, DeathsWhateverIsHeldBackQuarantineNobody) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  Begin(search, now, kModels, milliseconds(900));
  // The server's own fault: it dies whatever is held back.
  const CulpritSearch::Step step = RunToTheEnd(search, [&] {
    return search.NoteUnnamedDeath(now += seconds(1), Loaded(search), milliseconds(900));
  });
  EXPECT_NE(step.what.find("nothing found"), std::string::npos) << step.what;
}

TEST(CulpritSearch, TheTrialOutlastsTheLongestLifeThatBeganTheSearch) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  for (const milliseconds life : {milliseconds(4000), milliseconds(30'200), milliseconds(9000)}) {
    search.NoteUnnamedDeath(now += seconds(60), kModels, life);
  }
  ASSERT_TRUE(search.searching());
  EXPECT_EQ(search.trial(), seconds(121));
  EXPECT_FALSE(search.NoteServing(seconds(120)).restart);
  EXPECT_TRUE(search.NoteServing(seconds(121)).restart);
}

TEST(CulpritSearch, TheOnlyModelLoadedIsTriedBothWays) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  Begin(search, now, {"only:2"}, milliseconds(900));
  EXPECT_EQ(search.held_back(), std::set<std::string>{"only:2"});
  EXPECT_TRUE(search.NoteServing(search.trial()).restart);
  EXPECT_TRUE(search.held_back().empty());
  const CulpritSearch::Step step =
      search.NoteUnnamedDeath(now += seconds(1), {"only:2"}, milliseconds(900));
  ASSERT_TRUE(step.culprit);
  EXPECT_EQ(*step.culprit, "only:2");
  EXPECT_FALSE(search.searching());
}

TEST(CulpritSearch, AStartThatLoadedNothingStartsNoSearch) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  for (int death = 0; death < 5; ++death) {
    EXPECT_FALSE(search.NoteUnnamedDeath(now += seconds(1), {}, milliseconds(900)).culprit);
  }
  EXPECT_FALSE(search.searching());
}

TEST(CulpritSearch, AModelLoadedExplicitlyIsNoSuspectAndTheSearchGoesOn) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  Begin(search, now, kModels, milliseconds(900));
  ASSERT_EQ(search.held_back(), (std::set<std::string>{"a:1", "b:1", "c:1"}));
  // A model that is not held back (a forged line's, say) changes nothing.
  EXPECT_TRUE(search.Excuse("d:1").what.empty());
  EXPECT_FALSE(search.Excuse("b:1").what.empty());
  EXPECT_TRUE(search.searching());
  EXPECT_EQ(search.held_back(), (std::set<std::string>{"a:1", "c:1"}));
  EXPECT_EQ(search.suspects(), (std::vector<std::string>{"a:1", "c:1", "d:1", "e:1"}));
  // The culprit, e, loaded: the search still finds it.
  search.NoteUnnamedDeath(now += seconds(1), {"b:1", "d:1", "e:1"}, milliseconds(900));
  EXPECT_EQ(search.suspects(), (std::vector<std::string>{"d:1", "e:1"}));
}

TEST(CulpritSearch, ExcusingTheLastSuspectEndsTheSearch) {
  CulpritSearch search(Settings());
  CulpritSearch::Clock::time_point now{};
  Begin(search, now, {"only:1"}, milliseconds(900));
  ASSERT_EQ(search.held_back(), std::set<std::string>{"only:1"});
  EXPECT_NE(search.Excuse("only:1").what.find("nothing found"), std::string::npos);
  EXPECT_FALSE(search.searching());
  EXPECT_TRUE(search.held_back().empty());
}

}  // namespace
}  // namespace orochi::server
