package bench

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart draws three bar charts per case into path (.png or .svg): Core's duration
// (minutes) and the fetch error rate (%), ours beside the published value, and the time
// until the client held every result (minutes), which the seed did not publish. A case
// without a figure (no published row, as Bridge's; no fetch error rate) has no bar,
// rather than one of 0.
func Chart(path string, figs []Figures, pub map[string]Published) error {
	names := make([]string, len(figs))
	durOurs, durPub := make([]*float64, len(figs)), make([]*float64, len(figs))
	errOurs, errPub := make([]*float64, len(figs)), make([]*float64, len(figs))
	last, none := make([]*float64, len(figs)), make([]*float64, len(figs))
	for i, f := range figs {
		names[i] = f.Case
		durOurs[i], errOurs[i], last[i] = &f.DurationMin, f.FetchErrorRatePct, &f.AllResultsMin
		if p, ok := publishedFor(pub, f.Case); ok {
			durPub[i], errPub[i] = &p.DurationMin, p.FetchErrorRatePct
		}
	}
	dur, err := barPlot("Duration per case", "minutes", names, durOurs, durPub)
	if err != nil {
		return err
	}
	errp, err := barPlot("Fetch error rate per case", "% of fetches answered 503", names, errOurs, errPub)
	if err != nil {
		return err
	}
	lastp, err := barPlot("Time until the client holds every result", "minutes", names, last, none)
	if err != nil {
		return err
	}
	return writeStacked(path, vg.Length(80*len(names)+120), 13*vg.Inch, dur, errp, lastp)
}

// barPlot returns a bar chart of one figure per case, ours and the published one side by
// side at each name (nil: no bar). Its Y axis starts at 0 and leaves a fifth of its
// height above the tallest bar for the legend (1 at least, when every value is 0); its
// X axis leaves half a slot on either side, so that the outer bars and names are whole.
func barPlot(title, ylabel string, names []string, ours, theirs []*float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	w := vg.Points(12)
	top := 0.0
	for _, s := range []struct {
		vals   []*float64
		color  color.Color
		offset vg.Length
		legend string
	}{
		{ours, color.RGBA{R: 31, G: 119, B: 180, A: 255}, -w / 2, "mdbench"},
		{theirs, color.RGBA{R: 255, G: 127, B: 14, A: 255}, w / 2, "published (Rate-N for Proxy-N)"},
	} {
		bars, err := barsOf(s.vals, w, s.color, s.offset)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", title, err)
		}
		for i, b := range bars {
			p.Add(b)
			if i == 0 {
				p.Legend.Add(s.legend, b)
			}
			top = max(top, b.Values[0])
		}
	}
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
	p.Y.Min, p.Y.Max = 0, max(top*1.2, 1)
	return p, nil
}

// barsOf returns a bar of width w, color c, offset from its slot's centre, for each value
// that vals has, at its index's slot; none for a nil.
func barsOf(vals []*float64, w vg.Length, c color.Color, offset vg.Length) ([]*plotter.BarChart, error) {
	var bars []*plotter.BarChart
	for i, v := range vals {
		if v == nil {
			continue
		}
		b, err := plotter.NewBarChart(plotter.Values{*v}, w)
		if err != nil {
			return nil, err
		}
		b.XMin, b.Color, b.Offset = float64(i), c, offset
		bars = append(bars, b)
	}
	return bars, nil
}

// CheckChartPath returns an error unless path names a file Chart and SoakChart can
// draw: one ending in .png or .svg (in any case).
func CheckChartPath(path string) error {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png", ".svg":
		return nil
	}
	return fmt.Errorf("chart %s: want a .png or .svg file", path)
}

// writeStacked draws plots one above the other on a canvas of width × height and writes
// it to path, a PNG or SVG file by its extension.
func writeStacked(path string, width, height vg.Length, plots ...*plot.Plot) error {
	var c vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	case ".svg":
		c = vgsvg.New(width, height)
	default:
		return CheckChartPath(path)
	}
	dc := draw.New(c.(vg.CanvasSizer))
	rows := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		rows[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter}
	canvases := plot.Align(rows, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	return writeTo(path, c)
}

func writeTo(path string, c interface {
	WriteTo(w io.Writer) (int64, error)
}) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
