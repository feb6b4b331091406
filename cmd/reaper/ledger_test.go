package main

import (
	"strings"
	"testing"
)

// ledger get refuses an id EC2 would not take (8 or 17 hex digits) before
// it reads anything: such an id has no record.
func TestLedgerGetRefusesMalformedID(t *testing.T) {
	t.Setenv("REAPER_TABLE", "reaper-ledger")
	for _, id := range []string{"i-0123456789", "i-0123456789abcdef", "web-1"} {
		err := runLedger(t.Context(), []string{"get", id})
		if err == nil || !strings.Contains(err.Error(), "not an EC2 instance id") || !strings.Contains(err.Error(), id) {
			t.Errorf("ledger get %s: %v, want it refused as not an EC2 instance id", id, err)
		}
	}
}
