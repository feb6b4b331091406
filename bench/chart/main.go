// Command chart draws the burst benchmark's timeline as a PNG: how many
// exits had been delivered, how many Pods were terminal and how many
// instances were shutting down, second by second after the first delivery.
// It reads the CSV BenchmarkBurst writes (bench/burst-timeline.csv).
//
//	go run ./bench/chart -in bench/burst-timeline.csv -out bench/burst.png
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Columns of the timeline: one row per Pod, times in seconds after the
// first delivery, empty when it never happened.
var columns = []string{"pod", "delivered_s", "terminal_s", "shutting_down_s"}

func main() {
	in := flag.String("in", "bench/burst-timeline.csv", "timeline CSV written by BenchmarkBurst")
	out := flag.String("out", "bench/burst.png", "PNG to write")
	title := flag.String("title", "", "chart title (default: the number of exits)")
	flag.Parse()
	if err := run(*in, *out, *title); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out, title string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	series, err := readTimeline(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	p, err := draw(series, title)
	if err != nil {
		return err
	}
	return p.Save(8*vg.Inch, 4*vg.Inch, out)
}

// timeline holds, per column after "pod", the sorted times of the events.
type timeline struct {
	pods                              int
	delivered, terminal, shuttingDown []float64
}

func readTimeline(r io.Reader) (timeline, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return timeline{}, err
	}
	if !slices.Equal(header, columns) {
		return timeline{}, fmt.Errorf("header %v, want %v", header, columns)
	}
	var tl timeline
	for {
		row, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return tl, err
		}
		tl.pods++
		for i, dst := range []*[]float64{&tl.delivered, &tl.terminal, &tl.shuttingDown} {
			v := row[i+1]
			if v == "" {
				continue
			}
			s, err := strconv.ParseFloat(v, 64)
			if err != nil || s < 0 {
				return tl, fmt.Errorf("row %d: %s %q is not a time in seconds", tl.pods, columns[i+1], v)
			}
			*dst = append(*dst, s)
		}
	}
	if tl.pods == 0 {
		return tl, errors.New("no rows")
	}
	for _, s := range [][]float64{tl.delivered, tl.terminal, tl.shuttingDown} {
		slices.Sort(s)
	}
	return tl, nil
}

// cumulative is the step curve of how many events had happened by each time.
func cumulative(times []float64) plotter.XYs {
	xys := plotter.XYs{{X: 0, Y: 0}}
	for i, t := range times {
		xys = append(xys, plotter.XY{X: t, Y: float64(i)}, plotter.XY{X: t, Y: float64(i + 1)})
	}
	return xys
}

func draw(tl timeline, title string) (*plot.Plot, error) {
	p := plot.New()
	if title == "" {
		title = fmt.Sprintf("Burst of %d exits", tl.pods)
	}
	p.Title.Text = title
	p.X.Label.Text = "seconds after the first delivery"
	p.Y.Label.Text = "count"
	p.Legend.Top, p.Legend.Left = false, false
	for _, s := range []struct {
		name  string
		times []float64
		color color.RGBA
	}{
		{"exits delivered", tl.delivered, color.RGBA{R: 120, G: 120, B: 120, A: 255}},
		{"Pods terminal", tl.terminal, color.RGBA{R: 31, G: 119, B: 180, A: 255}},
		{"instances shutting down", tl.shuttingDown, color.RGBA{R: 214, G: 39, B: 40, A: 255}},
	} {
		l, err := plotter.NewLine(cumulative(s.times))
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = s.color, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%d)", s.name, len(s.times)), l)
	}
	p.Y.Min, p.Y.Max = 0, float64(tl.pods)*1.05
	p.Add(plotter.NewGrid())
	return p, nil
}
