package bench

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
	"image/color"
	"io"
	"os"
)

// Chart draws two bar charts, duration (minutes) and fetch error rate (%) per case, ours
// beside the published value, into path (.png or .svg).
func Chart(path string, figs []Figures, pub map[string]Published) error {
	names := make([]string, len(figs))
	var durOurs, durPub, errOurs, errPub plotter.Values
	for i, f := range figs {
		names[i] = f.Case
		p, _ := publishedFor(pub, f.Case)
		durOurs = append(durOurs, f.DurationMin)
		durPub = append(durPub, p.DurationMin)
		e, pe := 0.0, 0.0
		if f.FetchErrorRatePct != nil {
			e = *f.FetchErrorRatePct
		}
		if p.FetchErrorRatePct != nil {
			pe = *p.FetchErrorRatePct
		}
		errOurs = append(errOurs, e)
		errPub = append(errPub, pe)
	}
	mk := func(title, ylabel string, ours, theirs plotter.Values) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = ylabel
		w := vg.Points(12)
		b1, err := plotter.NewBarChart(ours, w)
		if err != nil {
			return nil, err
		}
		b1.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
		b1.Offset = -w / 2
		b2, err := plotter.NewBarChart(theirs, w)
		if err != nil {
			return nil, err
		}
		b2.Color = color.RGBA{R: 255, G: 127, B: 14, A: 255}
		b2.Offset = w / 2
		p.Add(b1, b2)
		p.Legend.Add("mdbench", b1)
		p.Legend.Add("published (Rate-N for Proxy-N)", b2)
		p.Legend.Top = true
		p.NominalX(names...)
		return p, nil
	}
	dur, err := mk("Duration per case", "minutes", durOurs, durPub)
	if err != nil {
		return err
	}
	errp, err := mk("Fetch error rate per case", "% of fetches answered 503", errOurs, errPub)
	if err != nil {
		return err
	}
	return writeStacked(path, vg.Length(80*len(figs)+120), 9*vg.Inch, dur, errp)
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
