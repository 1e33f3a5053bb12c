package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
)

// palette is colour-blind safe (Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

// series is one line of the plot: a TP degree and run, over budgets.
type series struct {
	label  string
	tree   [][2]float64 // (budget, tok/s): the baseline at 0, then DDTree budgets
	linear [][2]float64 // the DFlash chain at its block size - 1
}

func (r *Results) series() []series {
	var out []series
	index := map[string]int{}
	multi := r.multiSource()
	for _, row := range r.Rows {
		if row.Knobs.Spec == "adaptive" {
			continue // no fixed budget to plot it at
		}
		label := fmt.Sprintf("tp%d %s", row.Knobs.TP, row.Run.RunKey)
		if multi {
			label = filepath.Base(row.Source) + " " + label
		}
		i, ok := index[label]
		if !ok {
			i = len(out)
			index[label] = i
			out = append(out, series{label: label})
		}
		p := [2]float64{float64(row.Knobs.Budget), row.Run.Metrics.OutputThroughput}
		if row.Knobs.Spec == "linear" {
			out[i].linear = append(out[i].linear, p)
		} else {
			out[i].tree = append(out[i].tree, p) // rows are sorted by budget
		}
	}
	return out
}

// niceStep is a 1, 2 or 5 times a power of ten that cuts span into about n parts.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// SVG draws output throughput against the verify budget, one line per TP
// degree and run (autoregressive at budget 0, DDTree at its budgets) and a
// diamond for the linear DFlash chain at its block size - 1.
func (r *Results) SVG(w io.Writer) error {
	const width, height, left, right, top, bottom = 760.0, 430.0, 64.0, 250.0, 48.0, 52.0
	ss := r.series()
	maxX, maxY := 1.0, 1.0
	for _, s := range ss {
		for _, p := range append(s.tree, s.linear...) {
			maxX, maxY = max(maxX, p[0]), max(maxY, p[1])
		}
	}
	xStep, yStep := niceStep(maxX, 8), niceStep(maxY, 5)
	maxX, maxY = math.Ceil(maxX/xStep)*xStep, math.Ceil(maxY*1.05/yStep)*yStep
	pw, ph := width-left-right, height-top-bottom
	x := func(v float64) float64 { return left + v/maxX*pw }
	y := func(v float64) float64 { return top + ph - v/maxY*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%g" height="%g" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%g" y="20" font-size="15" font-weight="bold">Output throughput vs. verify budget</text>`+"\n", left)
	if host := strings.Join(slices.DeleteFunc([]string{r.CPU, r.GPU}, func(s string) bool { return s == "" }), ", "); host != "" {
		fmt.Fprintf(&b, `<text x="%g" y="34" font-size="11" fill="#555">%s</text>`+"\n", left, html.EscapeString(host))
	}
	for v := 0.0; v <= maxY+yStep/2; v += yStep {
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%g</text>`+"\n",
			left, y(v), left+pw, y(v), left-6, y(v)+4, v)
	}
	for v := 0.0; v <= maxX+xStep/2; v += xStep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#888"/><text x="%.1f" y="%g" text-anchor="middle">%g</text>`+"\n",
			x(v), top+ph, x(v), top+ph+5, x(v), top+ph+18, v)
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">verify budget (tree nodes; 0 = autoregressive)</text>`+"\n", left+pw/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">output tok/s</text>`+"\n", top+ph/2)
	for i, s := range ss {
		color := palette[i%len(palette)]
		if len(s.tree) > 1 {
			var pts []string
			for _, p := range s.tree {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), color)
		}
		for _, p := range s.tree {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s budget %g: %.1f tok/s</title></circle>`+"\n",
				x(p[0]), y(p[1]), color, html.EscapeString(s.label), p[0], p[1])
		}
		for _, p := range s.linear {
			cx, cy := x(p[0]), y(p[1])
			fmt.Fprintf(&b, `<path d="M%.1f %.1fl5 5l-5 5l-5 -5z" fill="white" stroke="%s" stroke-width="2"><title>%s linear: %.1f tok/s</title></path>`+"\n",
				cx, cy-5, color, html.EscapeString(s.label), p[1])
		}
		ly := top + 8 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/><text x="%g" y="%g">%s</text>`+"\n",
			left+pw+14, ly, left+pw+34, ly, color, left+pw+40, ly+4, html.EscapeString(s.label))
	}
	ly := top + 8 + float64(len(ss))*18 + 6
	fmt.Fprintf(&b, `<path d="M%g %gl5 5l-5 5l-5 -5z" fill="white" stroke="#444" stroke-width="2"/><text x="%g" y="%g">linear DFlash (block - 1)</text>`+"\n",
		left+pw+24, ly-5, left+pw+40, ly+4)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
