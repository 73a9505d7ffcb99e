package demo

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/fleetenv"
	"github.com/admitkit/admit/examples/outgress/helix"
	"github.com/admitkit/admit/examples/outgress/limits"
	"github.com/admitkit/admit/examples/outgress/metrics"
	"github.com/admitkit/admit/examples/outgress/mgmt"
	"github.com/admitkit/admit/examples/outgress/pause"
	"github.com/admitkit/admit/examples/outgress/worker"
)

type replicaReport struct {
	name  string
	snap  pause.Snapshot
	age   time.Duration
	stats pause.Stats
	mgmt  mgmt.Stats
}

// Result is everything a run measured.
type Result struct {
	cfg            Config
	where          string
	helixURL       string
	warmupCommands int64
	rows           *worker.PathTable
	oldShape       worker.PathTable
	metrics        *metrics.Metrics
	pauseLog       []PauseChange
	status         mgmt.Status // the status request after the run
	statusErr      error
	natsWhere      string
	published      int
	refused        int          // publishes the stream did not acknowledge
	finals         atomic.Int64 // deliveries that ended a message: acked or dropped
	unfinished     int64        // still in the stream at the end
	restartErr     error
	restartedAt    time.Duration // when B's restart began, from the start
	pausedMsgs     int           // the paused batch: published while every replica was paused
	contract       []ContractCase
	elapsed        time.Duration
	bus            bus.Stats // summed over every replica's connections
	reported       int64
	// reportedExpired is how many of the errors reported were the
	// message's lifetime ending during a call (context.DeadlineExceeded);
	// firstError is the first of the others.
	reportedExpired int64
	firstError      string
	replicas        []replicaReport
	helixConns      int64
	helixRequests   int64
	metricsURL      string
	scrape          []string // the /metrics excerpt
}

// Print writes the report for a newcomer.
func (r *Result) Print(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	workers := fmt.Sprintf("%d standard, %d premium and %d system workers", fleetenv.LaneWorkers[limits.LaneStandard], fleetenv.LaneWorkers[limits.LanePremium], fleetenv.LaneWorkers[limits.LaneSystem])
	fmt.Fprintf(out, "outgress: an egress worker's hot path on admit\n")
	fmt.Fprintf(out, "  Valkey  %s\n", r.where)
	fmt.Fprintf(out, "  NATS    %s\n", r.natsWhere)
	fmt.Fprintf(out, "  Helix   fake server at %s (HTTP/1.1)\n", r.helixURL)
	fmt.Fprintf(out, "  fleet   2 replicas (A, B), each with its own Valkey client, pause snapshot,\n")
	fmt.Fprintf(out, "          channel cache and HTTP transport, and %s\n", workers)
	fmt.Fprintf(out, "  mix     %d messages (%v at %d/s) on %d channels (3 of them hot); sending paused\n",
		r.published, r.cfg.Duration, r.cfg.Rate, r.cfg.Channels)
	if len(r.pauseLog) == 2 {
		fmt.Fprintf(out, "          from %v to %v, after %v of them, with %d published meanwhile; run took %v\n\n",
			r.pauseLog[0].At.Round(10*time.Millisecond), r.pauseLog[1].At.Round(10*time.Millisecond), r.cfg.PauseAt, r.pausedMsgs, r.elapsed.Round(10*time.Millisecond))
	} else {
		fmt.Fprintf(out, "          after %v of them; run took %v\n\n", r.cfg.PauseAt, r.elapsed.Round(10*time.Millisecond))
	}

	fmt.Fprintln(out, "1. Valkey commands per message, by path (each message's commands counted by a wrapped client)")
	fmt.Fprintln(w, "   \tbefore\t\tafter\t\t\t\t")
	fmt.Fprintln(w, "   path\tplan\tmeasured\tplan\tmeasured\tmessages\tmin-max\t")
	for row := range worker.NumRows {
		s := r.rows.Row(row)
		before, target, old := "-", "-", "-"
		if row <= worker.RowPremCold {
			before, target = fmt.Sprint(worker.PlanBefore[row]), fmt.Sprint(worker.PlanTarget[row])
			if o := r.oldShape.Row(row); o.N > 0 {
				old = fmt.Sprintf("%.2f", float64(o.Commands)/float64(o.N))
			}
		}
		mean, span := "-", "-"
		if s.N > 0 {
			mean = fmt.Sprintf("%.2f", float64(s.Commands)/float64(s.N))
			span = fmt.Sprintf("%d-%d", s.Min, s.Max)
		}
		fmt.Fprintf(w, "   %s\t%s\t%s\t%s\t%s\t%d\t%s\t\n", worker.RowNames[row], before, old, target, mean, s.N, span)
	}
	w.Flush()
	fmt.Fprintln(out, "   before: a pause GET, the channel HGETALL when cold, then one script per bucket in turn")
	fmt.Fprintln(out, "           (measured on one cold and one warm message per lane, on channels outside the mix).")
	fmt.Fprintln(out, "   after:  an atomic pause snapshot, the HGETALL when cold, then one script for both buckets")
	fmt.Fprintln(out, "           (measured on every message of the mix).")
	fmt.Fprintf(out, "   Each command was its own round trip. Not counted: a warm-up decision before the run,\n")
	if r.warmupCommands > 1 {
		fmt.Fprintf(out, "   which cost %d: the server had no cached script, so EVALSHA answered NOSCRIPT, then EVAL.\n\n", r.warmupCommands)
	} else {
		fmt.Fprintf(out, "   which cost %d: the server had the script cached already.\n\n", r.warmupCommands)
	}

	fmt.Fprintln(out, "2. Pause (the kill switch), set mid-run by an operator's set_paused request: one replica of the queue group")
	fmt.Fprintln(out, "   executes it, the other learns by its event on a NATS subject")
	for _, ev := range r.pauseLog {
		if ev.Err != nil {
			fmt.Fprintf(out, "   %6v  SetPaused(%v) failed: %v\n", ev.At.Round(time.Millisecond), ev.Paused, ev.Err)
			continue
		}
		var seen []string
		for i, d := range ev.Seen {
			name := r.replicas[i].name
			if d < 0 {
				seen = append(seen, name+" not within "+SeenWithin.String())
			} else {
				how := "NATS event"
				if name == ev.By {
					how = "executed it"
				}
				seen = append(seen, fmt.Sprintf("%s (%s) after %v", name, how, d.Round(10*time.Microsecond)))
			}
		}
		fmt.Fprintf(out, "   %6v  set_paused(%v) -> version %d; replicas acting on it: %s\n", ev.At.Round(time.Millisecond), ev.Paused, ev.Version, strings.Join(seen, ", "))
	}
	for _, rep := range r.replicas {
		st := "running"
		if rep.snap.Paused {
			st = "paused"
		}
		fmt.Fprintf(out, "   at the end, %s: %s at version %d, confirmed by Valkey %v ago; %d events applied, %d ignored; %d reconciles, %d failed\n",
			rep.name, st, rep.snap.Version, rep.age.Round(time.Millisecond), rep.stats.EventsApplied, rep.stats.EventsIgnored, rep.stats.Reconciles, rep.stats.ReconcileFailures)
		fmt.Fprintf(out, "              it executed %d set_paused requests and answered %d status requests\n", rep.mgmt.SetPaused, rep.mgmt.Status)
	}
	if r.statusErr != nil {
		fmt.Fprintf(out, "   status request after the run failed: %v\n", r.statusErr)
	} else {
		s := r.status
		fmt.Fprintf(out, "   status request after the run, answered by %s from a Valkey lookup (not its snapshot): paused %v at version %d\n", s.Replica, s.Paused, s.Version)
	}
	fmt.Fprintln(out)

	fmt.Fprintln(out, "3. Limiter decisions by lane (denials are counted by the class of the bucket that refused)")
	fmt.Fprintln(w, "   lane\tadmitted\tdenied: standard share\tshared chat limit\tHelix general\tsystem share\t")
	for lane := range limits.NumLanes {
		fmt.Fprintf(w, "   %v\t%d\t%d\t%d\t%d\t%d\t\n", lane, r.metrics.Admitted(lane),
			r.metrics.Denied(lane, limits.ClassStandard), r.metrics.Denied(lane, limits.ClassShared), r.metrics.Denied(lane, limits.ClassGeneral), r.metrics.Denied(lane, limits.ClassSystem))
	}
	w.Flush()
	for _, line := range r.premiumSentence() {
		fmt.Fprintln(out, "   "+line)
	}
	fmt.Fprintln(out, "   admit's error contract, on four premium messages whose script calls fail:")
	for _, c := range r.contract {
		outcome := "admitted"
		switch {
		case errors.Is(c.Err, admit.ErrOutcomeUnknown) && c.LimiterCalls == 1:
			outcome = "ErrOutcomeUnknown, not repeated: the error nacks the message"
		case errors.Is(c.Err, admit.ErrOutcomeUnknown):
			outcome = "ErrOutcomeUnknown again: the error nacks the message"
		case c.Err != nil:
			outcome = "failed: " + c.Err.Error()
		case !c.Admitted:
			outcome = "denied"
		}
		mode := "default"
		if c.RetryUnknown {
			mode = "RetryOutcomeUnknown"
		}
		fmt.Fprintf(out, "     %s (%s): %d limiter call(s), %s, %d token(s) charged\n", c.Fault, mode, c.LimiterCalls, outcome, c.Charged)
	}
	fmt.Fprintln(out, "   (ErrNotExecuted: nothing ran, retried up to 3 calls. ErrOutcomeUnknown: not repeated, as the plan")
	fmt.Fprintln(out, "   says of its script; with the opt-in RetryOutcomeUnknown, repeated once under the message's id, and the")
	fmt.Fprintln(out, "   server returns the Decision it recorded if the first call ran, and takes nothing.)")
	fmt.Fprintln(out)

	b := r.bus
	fmt.Fprintln(out, "4. Delivery on NATS JetStream (a work-queue stream, one durable consumer per lane shared by")
	fmt.Fprintf(out, "   both replicas; a message lives 5s); replica B's connection restarted at %v, after %v of the mix\n",
		r.restartedAt.Round(10*time.Millisecond), r.cfg.RestartAt)
	fmt.Fprintf(w, "   published\t%d\t(refused by the stream: %d)\t\n", r.published, r.refused)
	fmt.Fprintf(w, "   handler calls\t%d\t\t\n", b.Delivered)
	fmt.Fprintf(w, "   acked: sent\t%d\t\t\n", b.Acked)
	fmt.Fprintf(w, "   dropped (Term)\t%d\t%s\t\n", sum(b.Dropped[:]), labelled(b.Dropped[:], bus.DropReason.String))
	fmt.Fprintf(w, "   redelivered: expected nacks\t%d\t%s (NakWithDelay, no error report)\t\n", sum(b.Nacked[:]), labelled(b.Nacked[:], bus.NackReason.String))
	expired := ""
	if r.reportedExpired > 0 {
		expired = fmt.Sprintf(" (%d of them the message's lifetime ending during a call)", r.reportedExpired)
	}
	fmt.Fprintf(w, "   redelivered: errors\t%d\treported %d%s%s\t\n", b.Errors, r.reported, expired, prefixed(": ", r.firstError))
	fmt.Fprintf(w, "   redelivered: released\t%d\t(fetched by B as it restarted, handed back unhandled)\t\n", b.Released)
	fmt.Fprintf(w, "   unconfirmed acks\t%d\t\t\n", b.AckFailures)
	fmt.Fprintf(w, "   unfinished\t%d\t(still in the stream when the run ended)\t\n", r.unfinished)
	w.Flush()
	fmt.Fprintf(out, "   Every message is accounted for: %d acked + %d dropped + %d unfinished = %d, published %d.\n",
		b.Acked, sum(b.Dropped[:]), r.unfinished, b.Acked+sum(b.Dropped[:])+r.unfinished, r.published)
	if r.restartErr != nil {
		fmt.Fprintf(out, "   Replica B's restart failed: %v\n", r.restartErr)
	}
	fmt.Fprintln(out, "   A refusal by a limit is redelivered after the error delay (DelayUntilToken off, the default); a delay past")
	fmt.Fprintln(out, "   the message's remaining life drops it at once (Term, no_time_<cause>: limited, paused, throttled or error).")
	fmt.Fprintln(out)

	fmt.Fprintln(out, "5. Latency by stage, both replicas (upper bounds of Prometheus histogram buckets, about 42% wide)")
	fmt.Fprintln(w, "   stage\tcount\tp50\tp95\tp99\t")
	row := func(name string, l metrics.Latency) {
		fmt.Fprintf(w, "   %s\t%d\t%v\t%v\t%v\t\n", name, l.Count, seconds(l.P50), seconds(l.P95), seconds(l.P99))
	}
	for s := range metrics.NumStages {
		if s == metrics.StageBuild {
			row("limiter call", r.metrics.LimiterLatency())
		}
		row(s.String(), r.metrics.StageLatency(s))
	}
	w.Flush()
	fmt.Fprintln(out, "   pre_http is decode through build: the worker's own latency before calling Helix.")
	fmt.Fprintln(out, "   Caveat: measured on "+r.where+", a loopback fake Helix and a shared machine:")
	fmt.Fprintln(out, "   these latencies show the shape (round trips), not what production will see; miniredis runs")
	fmt.Fprintln(out, "   the script in Go, slower than Valkey. BenchmarkPreHTTP (README) measures a real server.")
	fmt.Fprintln(out)

	reused, fresh := r.metrics.Conns()
	fmt.Fprintln(out, "6. HTTP to Helix")
	fmt.Fprintf(out, "   responses: 2xx %d, 4xx %d, 401/403 %d, 429 %d, 5xx %d, no response %d\n", r.metrics.Status(helix.Status2xx),
		r.metrics.Status(helix.Status4xx), r.metrics.Status(helix.StatusAuth), r.metrics.Status(helix.Status429), r.metrics.Status(helix.Status5xx), r.metrics.Status(helix.StatusError))
	fmt.Fprintf(out, "   %d requests over %d TCP connections; sampled requests (1 in 16): %d reused a connection, %d dialled;\n",
		r.helixRequests, r.helixConns, reused, fresh)
	fmt.Fprintf(out, "   their responses came over HTTP/1 %d, HTTP/2 %d, other %d times (the fake serves HTTP/1.1 only)\n",
		r.metrics.Protos(helix.ProtoHTTP1), r.metrics.Protos(helix.ProtoHTTP2), r.metrics.Protos(helix.ProtoOther))
	fmt.Fprintln(out)

	fmt.Fprintf(out, "7. Prometheus: served on %s during the run; an excerpt of the last scrape\n", r.metricsURL)
	fmt.Fprintln(out, "   (deliveries and limiter calls that happened, and each replica's pause state; run with -hold to keep serving)")
	for _, line := range r.scrape {
		fmt.Fprintln(out, "   "+line)
	}
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// addStats adds two buses' counters.
func addStats(a, b bus.Stats) bus.Stats {
	a.Delivered += b.Delivered
	a.Acked += b.Acked
	a.Errors += b.Errors
	a.Released += b.Released
	a.AckFailures += b.AckFailures
	for i := range a.Nacked {
		a.Nacked[i] += b.Nacked[i]
	}
	for i := range a.Dropped {
		a.Dropped[i] += b.Dropped[i]
	}
	return a
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

func labelled[R ~uint8](counts []int64, name func(R) string) string {
	var parts []string
	for i, c := range counts {
		if c > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name(R(i)), c))
		}
	}
	return strings.Join(parts, ", ")
}

// seconds formats a histogram bound.
func seconds(s float64) string {
	if math.IsInf(s, 1) {
		return "> 10s"
	}
	return round(time.Duration(s * float64(time.Second))).String()
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}

// premiumSentence says what the run measured of the premium reserve: the
// chat tokens the standard lane took from the shared limit against its
// share's, and premium chat's admissions and refusals by the shared limit.
func (r *Result) premiumSentence() []string {
	m := r.metrics
	stdShare, stdShared := m.Tokens(limits.LaneStandard, limits.ClassStandard), m.Tokens(limits.LaneStandard, limits.ClassShared)
	refused := m.Denied(limits.LanePremium, limits.ClassShared)
	lines := []string{fmt.Sprintf("The standard lane took %d tokens of the shared chat limits, never one without its share's "+
		"(%d share tokens, chat and Helix): premium reserve taken by standard traffic: %d.", stdShared, stdShare, max(stdShared-stdShare, 0))}
	if refused == 0 {
		lines = append(lines, fmt.Sprintf("Premium (%d admitted in all) was never refused by a shared chat limit.", m.Admitted(limits.LanePremium)))
	} else {
		lines = append(lines, fmt.Sprintf("Premium (%d admitted in all) was refused %d times by a shared chat limit: on hot channels its own", m.Admitted(limits.LanePremium), refused),
			"traffic went past the reserve, not standard traffic (which cannot take it, above).")
	}
	return lines
}
