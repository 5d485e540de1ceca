package ui

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/delayq/delayq/delayq"
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

func newHourView(ms []delayq.Minute) hourView {
	var v hourView
	var all delayq.Histogram
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
func throughputSVG(ms []delayq.Minute) template.HTML {
	var top int64
	for _, m := range ms {
		top = max(top, m.Done)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart throughput" role="img" viewBox="0 0 %d %d" width="%d" height="%d" data-max="%d">`,
		chartW, chartH+12, chartW, chartH+12, top)
	fmt.Fprintf(&b, `<title>tasks done a minute, last hour (most %d)</title>`, top)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%d" x2="%d" y2="%d"/>`, chartH, chartW, chartH)
	for i, m := range ms {
		if m.Done == 0 || top == 0 {
			continue
		}
		hgt := math.Max(1, float64(m.Done)/float64(top)*float64(chartH-2))
		fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d done</title></rect>`,
			float64(i)*barW, float64(chartH)-hgt, barW-0.6, hgt, hhmm(m.Start), m.Done)
	}
	label(&b, ms, fmt.Sprintf("%d/min", top))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and fixed words only
}

// latenessSVG draws the p50 and p99 of each minute's claims on a log scale, from
// 1 ms to the decade above the hour's highest p99; a minute without claims breaks
// the lines.
func latenessSVG(ms []delayq.Minute) template.HTML {
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
		var path, dots strings.Builder // a lone minute shows as its dot
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
			fmt.Fprintf(&path, "%s%.1f %.1f", cmd, x, y(s.q[i]))
			fmt.Fprintf(&dots, `<circle class="%s" cx="%.1f" cy="%.1f" r="1.8"/>`, s.class, x, y(s.q[i]))
			pen = true
		}
		if path.Len() > 0 {
			fmt.Fprintf(&b, `<path class="%s" d="%s"/>%s`, s.class, path.String(), dots.String())
		}
	}
	for i := range ms {
		if has[i] {
			fmt.Fprintf(&b, `<rect class="hover" x="%.1f" y="0" width="%.1f" height="%d"><title>%s: p50 %s, p99 %s, %d claims</title></rect>`,
				float64(i)*barW, barW, chartH, hhmm(ms[i].Start), short(p50[i]), short(p99[i]), ms[i].Lateness.Count())
		}
	}
	label(&b, ms, "≤ "+short(time.Duration(math.Pow(10, decades))*time.Millisecond))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers and fixed words only
}

// label writes the time axis (the hour's first and last minutes) and, top left
// (the recent minutes are on the right), the top of the scale.
func label(b *strings.Builder, ms []delayq.Minute, top string) {
	if len(ms) == 0 {
		return
	}
	fmt.Fprintf(b, `<text class="tick" x="0" y="%d">%s</text>`, chartH+11, hhmm(ms[0].Start))
	fmt.Fprintf(b, `<text class="tick end" x="%d" y="%d">%s</text>`, chartW, chartH+11, hhmm(ms[len(ms)-1].Start))
	fmt.Fprintf(b, `<text class="tick" x="2" y="9">%s</text>`, template.HTMLEscapeString(top))
}
