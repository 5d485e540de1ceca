package ui

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// The queues page charts the last hour of each queue from its Redis history
// (delayq.Client.History): tasks done a minute, and the claims' lateness p50 and
// p99 a minute. The charts are SVG drawn here, on the server: no script, so the
// Content-Security-Policy stays without one. They hold numbers and times only
// (no name or payload), written with %d, %.1f and fixed words.

const (
	historyMinutes = 60
	chartW, chartH = 240, 48
	barW           = float64(chartW) / historyMinutes
)

// hourView is one queue's last hour.
type hourView struct {
	Done, Claims int64
	P50, P99     time.Duration // over the hour; 0 without claims
	Throughput   template.HTML
	Lateness     template.HTML
}

func newHourView(ms []dispatch.Minute) hourView {
	var v hourView
	var all dispatch.Histogram
	for i := range ms {
		v.Done += ms[i].Done
		all.Merge(&ms[i].Lateness)
	}
	v.Claims = all.Count()
	v.P50, _ = all.Quantile(0.5)
	v.P99, _ = all.Quantile(0.99)
	v.Throughput = throughputSVG(ms)
	v.Lateness = latenessSVG(ms)
	return v
}

func hhmm(t time.Time) string { return t.UTC().Format("15:04") }

// throughputSVG draws a bar a minute, as high as the tasks done in it.
func throughputSVG(ms []dispatch.Minute) template.HTML {
	var top int64
	for _, m := range ms {
		top = max(top, m.Done)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart throughput" role="img" viewBox="0 0 %d %d" width="%d" height="%d" data-max="%d">`,
		chartW, chartH+12, chartW, chartH+12, top)
	fmt.Fprintf(&b, `<title>tasks done a minute, last hour (most %d)</title>`, top)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%d" x2="%d" y2="%d"/>`, chartH, chartW, chartH)
	var w svgWriter // the loops append: a page draws thousands of these
	for i, m := range ms {
		if m.Done == 0 || top == 0 {
			continue
		}
		hgt := math.Max(1, float64(m.Done)/float64(top)*float64(chartH-2))
		w.s(`<rect class="bar" x="`).f(float64(i) * barW).s(`" y="`).f(float64(chartH) - hgt).s(`" width="`).f(barW - 0.6).
			s(`" height="`).f(hgt).s(`"><title>`).s(hhmm(m.Start)).s(`: `).n(m.Done).s(` done</title></rect>`)
	}
	b.Write(w)
	label(&b, ms, fmt.Sprintf("%d/min", top))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and fixed words only
}

// latenessSVG draws the p50 and p99 of each minute's claims on a log scale, from
// 1 ms to the decade above the hour's highest p99; a minute without claims breaks
// the lines.
func latenessSVG(ms []dispatch.Minute) template.HTML {
	p50 := make([]time.Duration, len(ms))
	p99 := make([]time.Duration, len(ms))
	has := make([]bool, len(ms))
	top := 10 * time.Millisecond
	for i := range ms {
		p50[i], has[i] = ms[i].Lateness.Quantile(0.5)
		p99[i], _ = ms[i].Lateness.Quantile(0.99)
		top = max(top, p99[i])
	}
	decades := math.Ceil(math.Log10(float64(top) / float64(time.Millisecond)))
	y := func(d time.Duration) float64 {
		l := math.Log10(math.Max(1, float64(d)/float64(time.Millisecond)))
		return float64(chartH) - l/decades*float64(chartH-2)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart lateness" role="img" viewBox="0 0 %d %d" width="%d" height="%d">`,
		chartW, chartH+12, chartW, chartH+12)
	b.WriteString(`<title>claim lateness a minute, last hour: p50 and p99 (log scale)</title>`)
	for d := 0.0; d <= decades; d++ {
		fmt.Fprintf(&b, `<line class="grid" x1="0" y1="%.1f" x2="%d" y2="%.1f"/>`,
			float64(chartH)-d/decades*float64(chartH-2), chartW, float64(chartH)-d/decades*float64(chartH-2))
	}
	for _, s := range []struct {
		class string
		q     []time.Duration
	}{{"p99", p99}, {"p50", p50}} {
		var path, dots svgWriter
		pen := false
		for i := range ms {
			if !has[i] {
				pen = false
				continue
			}
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			x := (float64(i) + 0.5) * barW
			path.s(cmd).f(x).s(" ").f(y(s.q[i]))
			if !pen && (i+1 == len(ms) || !has[i+1]) { // a lone minute: a line of one point shows nothing
				dots.s(`<circle class="`).s(s.class).s(`" cx="`).f(x).s(`" cy="`).f(y(s.q[i])).s(`" r="1.8"/>`)
			}
			pen = true
		}
		if len(path) > 0 {
			b.WriteString(`<path class="` + s.class + `" d="`)
			b.Write(path)
			b.WriteString(`"/>`)
			b.Write(dots)
		}
	}
	var w svgWriter
	for i := range ms {
		if has[i] {
			w.s(`<rect class="hover" x="`).f(float64(i) * barW).s(`" y="0" width="`).f(barW).s(`" height="`).n(chartH).
				s(`"><title>`).s(hhmm(ms[i].Start)).s(`: p50 `).s(short(p50[i])).s(`, p99 `).s(short(p99[i])).s(`, `).
				n(ms[i].Lateness.Count()).s(` claims</title></rect>`)
		}
	}
	b.Write(w)
	label(&b, ms, "≤ "+short(time.Duration(math.Pow(10, decades))*time.Millisecond))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and fixed words only
}

// label writes the time axis (the hour's first and last minutes) and, top left
// (the recent minutes are on the right), the top of the scale.
func label(b *strings.Builder, ms []dispatch.Minute, top string) {
	if len(ms) == 0 {
		return
	}
	fmt.Fprintf(b, `<text class="tick" x="0" y="%d">%s</text>`, chartH+11, hhmm(ms[0].Start))
	fmt.Fprintf(b, `<text class="tick end" x="%d" y="%d">%s</text>`, chartW, chartH+11, hhmm(ms[len(ms)-1].Start))
	fmt.Fprintf(b, `<text class="tick" x="2" y="9">%s</text>`, template.HTMLEscapeString(top))
}

// svgWriter appends SVG markup: fixed strings and numbers only.
type svgWriter []byte

func (w *svgWriter) s(x string) *svgWriter { *w = append(*w, x...); return w }

// f writes x with one decimal, as %.1f would.
func (w *svgWriter) f(x float64) *svgWriter { *w = strconv.AppendFloat(*w, x, 'f', 1, 64); return w }

func (w *svgWriter) n(x int64) *svgWriter { *w = strconv.AppendInt(*w, x, 10); return w }
