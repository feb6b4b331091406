package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A timeline becomes a PNG of the chart's size; a malformed one is an
// error naming the row.
func TestChart(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "t.csv"), filepath.Join(dir, "t.png")
	csv := "pod,delivered_s,terminal_s,shutting_down_s\np0,0.00,1.20,1.30\np1,0.01,1.25,\np2,0.02,,\n"
	if err := os.WriteFile(in, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, out, ""); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 8*96 || b.Dy() != 4*96 {
		t.Fatalf("chart is %v", b)
	}
	tl, err := readTimeline(strings.NewReader(csv))
	if err != nil || tl.pods != 3 || len(tl.delivered) != 3 || len(tl.terminal) != 2 || len(tl.shuttingDown) != 1 {
		t.Fatalf("timeline %+v, %v", tl, err)
	}
	if _, err := readTimeline(strings.NewReader("pod,delivered_s,terminal_s,shutting_down_s\np0,soon,,\n")); err == nil || !strings.Contains(err.Error(), "row 1") {
		t.Fatalf("malformed row: %v", err)
	}
}
