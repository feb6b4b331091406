package ec2server

import (
	"testing"
	"time"
)

func TestBucketArithmetic(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	b := bucket{capacity: 4, rate: 2, tokens: 4, last: t0}

	if !b.covers(4, t0) {
		t.Fatal("a full bucket does not cover its capacity")
	}
	b.take(4)
	if b.covers(1, t0) {
		t.Fatal("an empty bucket covers a token")
	}
	if b.covers(1, at(250*time.Millisecond)) {
		t.Error("half a token covers one")
	}
	if !b.covers(1, at(500*time.Millisecond)) {
		t.Fatal("no token after 0.5 s at 2/s")
	}
	b.take(1)
	// 2 tokens at 1.5 s: asking for 3 is refused and leaves the 2 in place.
	if b.covers(3, at(1500*time.Millisecond)) || !b.covers(2, at(1500*time.Millisecond)) {
		t.Errorf("at 1.5 s: tokens = %v, want 2", b.tokens)
	}
	// A clock read out of order between goroutines must not drain the bucket.
	if !b.covers(2, at(time.Second)) {
		t.Errorf("an earlier time took tokens away: %v", b.tokens)
	}
	if !b.covers(4, at(time.Hour)) || b.covers(4.5, at(time.Hour)) {
		t.Errorf("after an hour: tokens = %v, want the capacity 4", b.tokens)
	}

	unlimited := bucket{}
	if !unlimited.covers(1e9, t0) {
		t.Error("a zero-capacity bucket limits")
	}
}

func TestEnableBucketsScalesRefillOnly(t *testing.T) {
	s := New()
	defer s.Close()
	s.EnableBuckets(Limits{Terminate: Bucket{Capacity: 10, Refill: 5}, Describe: Bucket{Capacity: 3, Refill: 0.5}}, 60)
	if b := s.buckets.terminate; b.capacity != 10 || b.tokens != 10 || b.rate != 300 {
		t.Errorf("terminate bucket %+v, want capacity and tokens 10, rate 300/s", b)
	}
	if b := s.buckets.describe; b.capacity != 3 || b.rate != 30 {
		t.Errorf("describe bucket %+v, want capacity 3, rate 30/s", b)
	}
	defer func() {
		if recover() == nil {
			t.Error("EnableBuckets accepted scale 0")
		}
	}()
	s.EnableBuckets(PublishedLimits(), 0)
}

func TestBucketHeldEmpty(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	b := bucket{capacity: 4, rate: 2, tokens: 4, last: t0, heldUntil: at(time.Second)}

	if b.covers(1, t0) || b.covers(1, at(999*time.Millisecond)) {
		t.Fatal("a held bucket covers a token")
	}
	// From the end of the hold it refills from empty: half a token at
	// 1.25 s, one at 1.5 s, not the capacity it had before.
	if b.covers(1, at(1250*time.Millisecond)) {
		t.Error("the hold's time refilled the bucket")
	}
	if !b.covers(1, at(1500*time.Millisecond)) || b.covers(1.5, at(1500*time.Millisecond)) {
		t.Errorf("at 1.5 s: tokens = %v, want 1", b.tokens)
	}
}
