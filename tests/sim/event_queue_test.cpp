// The engine's event queue (sim/event_queue.hpp) against a plain (time, push order) priority
// queue: it batches consecutive same-time pushes into runs, and must pop exactly the same order.
#include "sim/event_queue.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <tuple>
#include <vector>

namespace moesim::sim {
namespace {

TEST(EventQueue, SameTimePushesPopInPushOrderAfterEarlierTimes) {
  EventQueue<int> q;
  q.push(2.0, 0);
  q.push(2.0, 1);  // joins the run of 0
  q.push(1.0, 2);
  q.push(2.0, 3);  // a new run at 2.0, after 0 and 1
  q.push(1.0, 4);
  ASSERT_EQ(q.size(), 5u);
  std::vector<int> order;
  std::vector<double> times;
  while (!q.empty()) {
    times.push_back(q.top_time());
    order.push_back(q.pop());
  }
  EXPECT_EQ(order, (std::vector<int>{2, 4, 0, 1, 3}));
  EXPECT_EQ(times, (std::vector<double>{1.0, 1.0, 2.0, 2.0, 2.0}));
}

TEST(EventQueue, AnEarlierPushBetweenARunsEventsGoesFirst) {
  // The network's completion at 1.5 arrives while the run at 2.0 is half drained.
  EventQueue<int> q;
  q.push(2.0, 0);
  q.push(2.0, 1);
  q.push(2.0, 2);
  EXPECT_EQ(q.pop(), 0);
  q.push(1.5, 3);
  EXPECT_EQ(q.top_time(), 1.5);
  EXPECT_EQ(q.pop(), 3);
  q.push(2.0, 4);  // after the rest of the first run: pushed later
  EXPECT_EQ(q.pop(), 1);
  EXPECT_EQ(q.pop(), 2);
  EXPECT_EQ(q.pop(), 4);
  EXPECT_TRUE(q.empty());
}

TEST(EventQueue, PopsTheSameOrderAsATimeAndSequenceHeap) {
  // Random interleavings as the engine makes them: pushes at or after the last popped time (some
  // before the queue's top), with few distinct times so runs form, split and refill.
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    EventQueue<int> q;
    using Ref = std::tuple<double, std::uint64_t, int>;
    std::priority_queue<Ref, std::vector<Ref>, std::greater<>> ref;
    std::uint64_t seq = 0;
    double now = 0;
    int next_id = 0;
    std::vector<int> got, want;
    auto push = [&] {
      const double t = now + static_cast<double>(rng() % 4);  // 0..3 after now: many ties
      q.push(t, next_id);
      ref.emplace(t, seq++, next_id);
      ++next_id;
    };
    for (int i = 0; i < 20; ++i) push();
    for (int step = 0; step < 4000 && !ref.empty(); ++step) {
      ASSERT_EQ(q.size(), ref.size());
      ASSERT_EQ(q.top_time(), std::get<0>(ref.top()));
      now = q.top_time();
      got.push_back(q.pop());
      want.push_back(std::get<2>(ref.top()));
      ref.pop();
      // The handler's pushes: 1.5 per pop on average while the queue is small, 0.5 once it holds
      // 200, so it neither dies out nor grows without bound.
      for (int n = static_cast<int>(rng() % (ref.size() < 200 ? 4 : 2)); n > 0; --n) push();
    }
    while (!ref.empty()) {
      got.push_back(q.pop());
      want.push_back(std::get<2>(ref.top()));
      ref.pop();
    }
    EXPECT_TRUE(q.empty());
    EXPECT_EQ(got, want) << "seed " << seed;
    EXPECT_GT(got.size(), 1000u);
  }
}

}  // namespace
}  // namespace moesim::sim
