// test-rollback-depth.cpp - the account of how far back a deepseek4 slot can drop positions,
// kept as the memory keeps it (patch 0010): the rows stepped since the last discard, up to
// the depth, none while a discard waits for its step.
#include "rollback_depth.h"
#include "service_test.h"

using namespace meshnet;

TEST("a slot can drop what its steps wrote since the last discard, up to the depth") {
    rollback_depth depth(2, 15);
    CHECK(depth.restorable(0) == 0 && !depth.can_drop(0, 1));
    depth.stepped(0, 8);
    depth.stepped(0, 8);
    CHECK(depth.restorable(0) == 15 && depth.can_drop(0, 15) && !depth.can_drop(0, 16));
    CHECK(!depth.can_drop(0, 0));
    CHECK(depth.restorable(1) == 0); // slots are apart
}

TEST("a discard leaves nothing to restore until its step ran, then what is left plus the step") {
    rollback_depth depth(1, 15);
    depth.stepped(0, 20);
    depth.dropped(0, 10);
    CHECK(depth.restorable(0) == 0 && !depth.can_drop(0, 1));
    depth.stepped(0, 8); // 5 left from before, 8 new
    CHECK(depth.restorable(0) == 13);
    depth.stepped(0, 8);
    CHECK(depth.restorable(0) == 15);
}

TEST("a cleared slot has nothing to restore and nothing pending") {
    rollback_depth depth(1, 7);
    depth.stepped(0, 5);
    depth.dropped(0, 2);
    depth.cleared(0);
    CHECK(depth.restorable(0) == 0);
    depth.stepped(0, 3);
    CHECK(depth.restorable(0) == 3 && depth.can_drop(0, 3));
}

TEST_MAIN()
