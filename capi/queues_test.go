package main

import "testing"

// A queue that fills and empties with every group message keeps its array: what it queues
// then allocates nothing. (It let the array go whenever it emptied, and regrew it each time.)
func TestQueueKeepsItsArrayBetweenBursts(t *testing.T) {
	q := &resultQueue{id: nextHandle()}
	c := &client{}
	slots := make([]resultSlot, 128)
	burst := func() {
		for i := range 300 { // more than a take holds: the array is left part-used, then empties
			q.add(c, outcome{id: uint64(i + 1)})
		}
		for q.take(slots) > 0 {
		}
	}
	burst()
	if n := testing.AllocsPerRun(20, burst); n != 0 {
		t.Errorf("a burst of 300 results allocated %v times after the first", n)
	}
	if got := q.take(slots); got != 0 {
		t.Errorf("took %d results from an emptied queue", got)
	}
	for i := range keptResults + 1 { // a burst larger than what is kept
		q.add(c, outcome{id: uint64(i + 1)})
	}
	for q.take(slots) > 0 {
	}
	if q.array != nil {
		t.Errorf("an emptied queue kept an array of %d results (at most %d are kept)", cap(q.array), keptResults)
	}
}
