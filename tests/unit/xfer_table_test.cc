// The endpoint's table of transfer ids: slots, generations, reuse.
#include "engine/xfer_table.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace tcpx::testing {
namespace {

using engine::XferTable;

uint64_t slot_of(XferId id) { return id & 0xffffffffu; }
uint32_t gen_of(XferId id) { return static_cast<uint32_t>(id >> 32); }

// One transfer at a time: the ids go round kReuseAfter slots, each slot's generation moving on
// once per round, so an id comes back only after 2^32 rounds (it came back after 2^32
// transfers when the slot just freed was taken again at once).
TEST(XferTable, OneTransferAtATimeGoesRoundManySlots) {
    XferTable table(65536, 5);
    std::set<uint64_t> slots;
    std::vector<XferId> first_round;
    const size_t n = 3 * XferTable::kReuseAfter + 7;
    for (size_t i = 0; i < n; ++i) {
        auto id = table.allocate();
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        slots.insert(slot_of(*id));
        if (i < XferTable::kReuseAfter) first_round.push_back(*id);
        // The round's slot, with its generation moved on once per round.
        if (i >= XferTable::kReuseAfter) {
            const XferId earlier = first_round[i % XferTable::kReuseAfter];
            EXPECT_EQ(slot_of(*id), slot_of(earlier)) << i;
            EXPECT_EQ(gen_of(*id), gen_of(earlier) + i / XferTable::kReuseAfter) << i;
        }
        table.finish(*id, Status());
        ASSERT_EQ(table.take(*id).state, XferState::kDone);
        // Reported: unknown from now on, and never mistaken for the slot's next transfer.
        XferState state;
        EXPECT_FALSE(table.state(*id, &state));
    }
    EXPECT_EQ(slots.size(), XferTable::kReuseAfter);
    EXPECT_EQ(table.slots_made(), XferTable::kReuseAfter);
    EXPECT_EQ(table.in_use(), 0u);
}

// A transfer's record (what cancel() acts on) is found by its id while it is in progress, and
// by no other id: not once it has finished (its record may be gone), not by the id of an
// earlier or later transfer in the same slot, not by a made-up one.
TEST(XferTable, ATransfersOwnerIsFoundByItsIdOnlyWhileInProgress) {
    XferTable table(4, 9);  // a full table reuses a slot at once
    int records[3];
    std::vector<XferId> ids;
    for (int& r : records) {
        auto id = table.allocate();
        ASSERT_TRUE(id.ok());
        EXPECT_EQ(table.owner(*id), nullptr);  // none set yet
        table.set_owner(*id, &r);
        ids.push_back(*id);
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(table.owner(ids[i]), &records[i]);
    EXPECT_EQ(table.owner(0), nullptr);
    EXPECT_EQ(table.owner(ids[0] + (uint64_t{1} << 32)), nullptr);  // another generation
    EXPECT_EQ(table.owner(ids[0] + 3), nullptr);                    // a slot never handed out
    // Finished: forgotten, though not yet reported; set_owner() cannot bring it back.
    table.finish(ids[1], Status());
    EXPECT_EQ(table.owner(ids[1]), nullptr);
    table.set_owner(ids[1], &records[1]);
    EXPECT_EQ(table.owner(ids[1]), nullptr);
    ASSERT_EQ(table.take(ids[1]).state, XferState::kDone);
    // The slot's next transfer starts without one, and the old id finds nothing.
    auto fourth = table.allocate();
    ASSERT_TRUE(fourth.ok());
    auto fifth = table.allocate();  // the table is full now: the freed slot comes back
    ASSERT_TRUE(fifth.ok());
    const XferId reused = slot_of(*fourth) == slot_of(ids[1]) ? *fourth : *fifth;
    ASSERT_EQ(slot_of(reused), slot_of(ids[1]));
    EXPECT_EQ(table.owner(reused), nullptr);
    table.set_owner(reused, &records[0]);
    EXPECT_EQ(table.owner(reused), &records[0]);
    EXPECT_EQ(table.owner(ids[1]), nullptr);
    // Cleared by hand (a record destroyed in progress): gone.
    table.set_owner(ids[2], nullptr);
    EXPECT_EQ(table.owner(ids[2]), nullptr);
    EXPECT_EQ(table.owner(ids[0]), &records[0]);
}

// Slots made stay within what is in flight plus kReuseAfter; a full table takes back any free
// slot at once, and refuses past its capacity.
TEST(XferTable, SlotsMadeStayBoundedAndAFullTableReusesAtOnce) {
    XferTable table(4096, 9);
    std::vector<XferId> live;
    for (int i = 0; i < 1000; ++i) live.push_back(*table.allocate());
    for (int round = 0; round < 20; ++round) {
        for (int i = 0; i < 100; ++i) {
            table.finish(live.front(), Status());
            (void)table.take(live.front());
            live.erase(live.begin());
            live.push_back(*table.allocate());
        }
    }
    EXPECT_LE(table.slots_made(), 1000 + XferTable::kReuseAfter);
    XferTable small(3, 1);
    std::vector<XferId> ids;
    for (int i = 0; i < 3; ++i) ids.push_back(*small.allocate());
    EXPECT_EQ(small.allocate().status().code(), StatusCode::kResourceExhausted);
    small.finish(ids[1], Status());
    (void)small.take(ids[1]);
    auto again = small.allocate();  // one free slot, fewer than kReuseAfter: taken, full table
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(slot_of(*again), slot_of(ids[1]));
    EXPECT_NE(*again, ids[1]);
}

}  // namespace
}  // namespace tcpx::testing
