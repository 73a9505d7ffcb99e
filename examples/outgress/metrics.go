package main

import (
	"math"
	"net/http"
	"sync/atomic"
	"time"
)

// Stage is a step of the message path, the label of its latency histogram.
type Stage uint8

// The stages, in path order. PreHTTP spans decode through build: the
// worker's own cost before the third party is called.
const (
	StageDecode  Stage = iota
	StagePause         // the pause snapshot check
	StageChannel       // channel cache lookup, hit or miss
	StageLoad          // channel lookups that were not hits: a load, or joining one
	StageLimiter       // the AllowOrdered call
	StageBuild         // building the Helix request
	StagePreHTTP       // decode through build
	StageHTTP          // the Helix request, through draining the body
	numStages
)

var stageNames = [numStages]string{"decode", "pause", "channel", "channel_load", "limiter", "build", "pre_http", "http"}

func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return "invalid"
}

// StatusClass is the fixed label for an HTTP outcome.
type StatusClass uint8

// The status classes.
const (
	Status2xx StatusClass = iota
	Status3xx
	Status4xx
	Status429
	Status5xx
	StatusError // no response: transport error or cancellation
	numStatus
)

var statusNames = [numStatus]string{"2xx", "3xx", "4xx", "429", "5xx", "error"}

func (s StatusClass) String() string {
	if s < numStatus {
		return statusNames[s]
	}
	return "invalid"
}

func statusClass(code int) StatusClass {
	switch {
	case code == http.StatusTooManyRequests:
		return Status429
	case code >= 200 && code < 300:
		return Status2xx
	case code >= 300 && code < 400:
		return Status3xx
	case code >= 400 && code < 500:
		return Status4xx
	default:
		return Status5xx
	}
}

// Metrics are the worker's counters and latency histograms. Every label is
// a value of a small fixed set (stage, lane, kind, bucket class, status
// class): never a channel id, a key or a URL, whose number is unbounded.
// All methods are safe for concurrent use and allocate nothing.
type Metrics struct {
	stages [numStages]Histogram
	// cache counts channel lookups by CacheUse.
	cache [numCacheUses]atomic.Int64
	// decisions counts limiter outcomes by lane: [lane][0] admitted,
	// [lane][1+class] denied by a bucket of that class.
	decisions [numLanes][1 + numClasses]atomic.Int64
	// kinds counts decoded commands by lane and kind.
	kinds [numLanes][numKinds]atomic.Int64
	// status counts Helix responses by class.
	status [numStatus]atomic.Int64
	// conns counts sampled connections: [0] reused, [1] new.
	conns [2]atomic.Int64
}

// Observe records one duration of a stage.
func (m *Metrics) Observe(s Stage, d time.Duration) {
	if s < numStages {
		m.stages[s].Observe(d)
	}
}

// Stage returns a stage's histogram.
func (m *Metrics) Stage(s Stage) *Histogram { return &m.stages[s%numStages] }

func (m *Metrics) cacheLookup(u CacheUse) { m.cache[u%numCacheUses].Add(1) }

func (m *Metrics) decision(lane Lane, allowed bool, class BucketClass) {
	if lane >= numLanes || class >= numClasses {
		return
	}
	if allowed {
		m.decisions[lane][0].Add(1)
	} else {
		m.decisions[lane][1+class].Add(1)
	}
}

func (m *Metrics) command(lane Lane, k Kind) {
	if lane < numLanes && k < numKinds {
		m.kinds[lane][k].Add(1)
	}
}

// Admitted returns the limiter's admissions on lane.
func (m *Metrics) Admitted(lane Lane) int64 { return m.decisions[lane%numLanes][0].Load() }

// Denied returns the limiter's denials on lane by a bucket of class.
func (m *Metrics) Denied(lane Lane, class BucketClass) int64 {
	return m.decisions[lane%numLanes][1+class%numClasses].Load()
}

// CacheLookups counts channel lookups of one kind (hit, miss or joined).
func (m *Metrics) CacheLookups(u CacheUse) int64 { return m.cache[u%numCacheUses].Load() }

// Status counts Helix outcomes of a class.
func (m *Metrics) Status(c StatusClass) int64 { return m.status[c%numStatus].Load() }

// Conns returns the sampled connection counts: reused and newly dialled.
func (m *Metrics) Conns() (reused, fresh int64) { return m.conns[0].Load(), m.conns[1].Load() }

// Commands counts decoded commands on lane of kind k.
func (m *Metrics) Commands(lane Lane, k Kind) int64 { return m.kinds[lane%numLanes][k%numKinds].Load() }

// Histogram is a latency histogram with logarithmic buckets, 8 per doubling
// (each bucket's bounds differ by about 9%), from 64 ns to about 70 s.
// Quantiles report the upper bound of the bucket they fall in. Observe is
// lock-free and allocation-free.
type Histogram struct {
	counts [histBuckets]atomic.Int64
	total  atomic.Int64
}

const (
	histPerDoubling = 8
	histMin         = 64 // ns: the upper bound of bucket 0
	histBuckets     = 30*histPerDoubling + 1
)

// Observe records d.
func (h *Histogram) Observe(d time.Duration) {
	h.counts[histBucket(int64(d))].Add(1)
	h.total.Add(1)
}

// Count returns the number of observations.
func (h *Histogram) Count() int64 { return h.total.Load() }

// Quantile returns an upper bound of the q-quantile (0 < q <= 1): the upper
// bound of the bucket holding the ceil(q×count)-th smallest observation; 0
// when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	var counts [histBuckets]int64
	var total int64
	for i := range counts {
		counts[i] = h.counts[i].Load()
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(total)))
	rank = min(max(rank, 1), total)
	var seen int64
	for i, c := range counts {
		if seen += c; seen >= rank {
			return histUpper(i)
		}
	}
	return histUpper(histBuckets - 1)
}

func histBucket(ns int64) int {
	if ns <= histMin {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(ns)/histMin) * histPerDoubling))
	return min(i, histBuckets-1)
}

func histUpper(i int) time.Duration {
	return time.Duration(math.Round(histMin * math.Exp2(float64(i)/histPerDoubling)))
}
