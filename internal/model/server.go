package model

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/admitkit/admit"
)

// An Outcome is what one call returns, as the model predicts it: the
// fields and methods of an admit.Decision, which cannot be built outside
// package admit with Allowed or Replayed set.
type Outcome struct {
	Denied     uint8
	RetryAfter time.Duration
	Remaining  [2]int
	Allowed    bool
	Replayed   bool
}

// Of returns the Outcome a Decision carries.
func Of(d admit.Decision) Outcome {
	return Outcome{Denied: d.Denied, RetryAfter: d.RetryAfter, Remaining: d.Remaining, Allowed: d.Allowed(), Replayed: d.Replayed()}
}

func (o Outcome) String() string {
	s := "allowed"
	if !o.Allowed {
		s = "denied by bucket " + strconv.Itoa(int(o.Denied)) + ", retry after " + strconv.FormatInt(o.RetryAfter.Microseconds(), 10) + "µs"
	}
	s += fmt.Sprintf(", remaining %d %d", o.Remaining[0], o.Remaining[1])
	if o.Replayed {
		s += ", replayed"
	}
	return s
}

// Charged reports whether the call that made o took tokens: an admission
// (both buckets) or a second-bucket denial (the first bucket), and never a
// replay.
func (o Outcome) Charged() bool { return !o.Replayed && (o.Allowed || o.Denied == 2) }

// An Expiry is how a server lets keys go: by an absolute time (Valkey,
// Redis) or by a TTL that counts down as the clock moves on (miniredis).
type Expiry uint8

const (
	// Absolute is Valkey and Redis: a key's expiry is a time in whole
	// milliseconds since the epoch, and the key is gone once the server's
	// clock, in whole milliseconds, has passed it. A clock stepped back
	// lengthens every key's life.
	Absolute Expiry = iota
	// Countdown is miniredis with ClockTTL: a key holds a TTL that counts
	// down as the clock moves forward and is gone when it reaches 0; a clock
	// stepped back leaves every TTL as it was.
	Countdown
)

// A Bucket is a stored bucket: its hash fields and when its key goes.
type Bucket struct {
	Tokens, TS int64
	// ExpireAt is when the key is gone, in µs since the epoch on the
	// server's clock (a whole millisecond on an Absolute server).
	ExpireAt int64
}

// A RecordID names a once-record: the first key and the id of the
// AllowOrderedOnce call that wrote it. Distinct RecordIDs are distinct
// records, however admit names their keys.
type RecordID struct{ Key, ID string }

// A Record is what AllowOrderedOnce remembers of a decision that charged
// something.
type Record struct {
	Outcome Outcome     // the decision as it was made (Replayed false)
	Request Fingerprint // the request it answered
	// ExpireAt is when the record is gone, as Bucket.ExpireAt.
	ExpireAt int64
	// Foreign is a value admit did not write (an operator's SET):
	// AllowOrderedOnce refuses it with ErrCorruptState.
	Foreign bool
}

// A Fingerprint is what a once-record must match to be replayed: the
// request beside its first key and id.
type Fingerprint struct {
	Buckets    int
	FirstSpec  admit.Spec
	FirstCost  int
	SecondKey  string
	SecondSpec admit.Spec
	SecondCost int
}

// FingerprintOf returns the fingerprint of a request pair.
func FingerprintOf(first admit.Request, second *admit.Request) Fingerprint {
	f := Fingerprint{Buckets: 1, FirstSpec: first.Spec, FirstCost: cost(first)}
	if second != nil {
		f.Buckets, f.SecondKey, f.SecondSpec, f.SecondCost = 2, second.Key, second.Spec, cost(*second)
	}
	return f
}

// Server is the model of a server's state as admit sees it: the buckets,
// the once-records, keys of other types that sit where admit expects a
// bucket, and the server's clock. Its methods are admit's calls: each
// returns what the call returns and changes the state as the call changes
// the server. Every error a method returns is a refusal that wrote nothing
// (admit.ErrNotExecuted) and wraps the reason's sentinel.
//
// A Server is not safe for simultaneous use; Clone it to try a call.
type Server struct {
	// Now is the server's clock, in µs since the epoch.
	Now    int64
	Expiry Expiry
	// Window is how long a once-record lives: admit.OnceWindow.
	Window  time.Duration
	Buckets map[string]Bucket
	Records map[RecordID]Record
	// Foreign holds keys at bucket names that are not hashes (a string an
	// operator SET), with their ExpireAt: every call naming one fails with
	// admit.ErrWrongType.
	Foreign map[string]int64
}

// NewServer returns an empty server whose clock reads now (µs since the
// epoch).
func NewServer(now int64, expiry Expiry) *Server {
	return &Server{
		Now: now, Expiry: expiry, Window: admit.OnceWindow,
		Buckets: map[string]Bucket{}, Records: map[RecordID]Record{}, Foreign: map[string]int64{},
	}
}

// Clone returns an independent copy of s.
func (s *Server) Clone() *Server {
	c := *s
	c.Buckets, c.Records, c.Foreign = maps.Clone(s.Buckets), maps.Clone(s.Records), maps.Clone(s.Foreign)
	return &c
}

// Advance moves the server's clock by d, which may be negative, and drops
// the keys whose time has come.
func (s *Server) Advance(d time.Duration) {
	us := d.Microseconds()
	s.Now += us
	if s.Expiry == Countdown && us < 0 { // the TTLs stay as they were
		for k, b := range s.Buckets {
			b.ExpireAt += us
			s.Buckets[k] = b
		}
		for k, r := range s.Records {
			r.ExpireAt += us
			s.Records[k] = r
		}
		for k, at := range s.Foreign {
			s.Foreign[k] = at + us
		}
	}
	s.expire()
}

// SetNow sets the server's clock to now, as Advance(now - Now) does.
func (s *Server) SetNow(now int64) { s.Advance(time.Duration(now-s.Now) * time.Microsecond) }

// Gone reports whether a key whose ExpireAt is at is gone at the server's
// clock.
func (s *Server) Gone(at int64) bool {
	if s.Expiry == Countdown {
		return s.Now >= at
	}
	return s.Now/1000 > at/1000
}

func (s *Server) expire() {
	for k, b := range s.Buckets {
		if s.Gone(b.ExpireAt) {
			delete(s.Buckets, k)
		}
	}
	for k, r := range s.Records {
		if s.Gone(r.ExpireAt) {
			delete(s.Records, k)
		}
	}
	for k, at := range s.Foreign {
		if s.Gone(at) {
			delete(s.Foreign, k)
		}
	}
}

// States returns the stored buckets as Decide and Refund take them.
func (s *Server) States() map[string]State {
	states := make(map[string]State, len(s.Buckets))
	for k, b := range s.Buckets {
		states[k] = State{Tokens: b.Tokens, TS: b.TS}
	}
	return states
}

// apply makes a decision's or a refund's writes.
func (s *Server) apply(writes map[string]Write) {
	for k, w := range writes {
		at := w.ExpireAtMs * 1000
		if w.Keep { // PEXPIREAT GT: only ever lengthened
			if b, ok := s.Buckets[k]; ok && at > b.ExpireAt {
				b.ExpireAt = at
				s.Buckets[k] = b
			}
			continue
		}
		s.Buckets[k] = Bucket{Tokens: w.Tokens, TS: w.TS, ExpireAt: at}
	}
}

// Validate returns the refusal admit gives a request pair before sending
// anything (admit.ErrInvalidRequest), or nil.
func Validate(first admit.Request, second *admit.Request) error {
	if err := validate("first", first); err != nil {
		return err
	}
	if second == nil {
		return nil
	}
	if err := validate("second", *second); err != nil {
		return err
	}
	if first.Key == second.Key {
		return fmt.Errorf("%w: first and second name the same key", admit.ErrInvalidRequest)
	}
	return nil
}

func validate(which string, r admit.Request) error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: %s request has an empty Key", admit.ErrInvalidRequest, which)
	case len(r.Key) > admit.MaxKeyLen:
		return fmt.Errorf("%w: %s request has a Key of %d bytes", admit.ErrInvalidRequest, which, len(r.Key))
	case r.Spec.IsZero():
		return fmt.Errorf("%w: %s request has the zero Spec", admit.ErrInvalidRequest, which)
	case r.Cost < 0 || r.Cost > r.Spec.Burst():
		return fmt.Errorf("%w: %s request has Cost %d outside [0, %d]", admit.ErrInvalidRequest, which, r.Cost, r.Spec.Burst())
	}
	return nil
}

// ValidateOnce returns the refusal AllowOrderedOnce gives before sending
// anything: Validate's, or an id that is empty or over admit.MaxOnceIDLen
// bytes, or a first key without a hash tag that holds a "}" (its record
// could not share its slot).
func ValidateOnce(id string, first admit.Request, second *admit.Request) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty once id", admit.ErrInvalidRequest)
	case len(id) > admit.MaxOnceIDLen:
		return fmt.Errorf("%w: once id of %d bytes", admit.ErrInvalidRequest, len(id))
	case first.Key != "" && !hasHashTag(first.Key) && strings.IndexByte(first.Key, '}') >= 0:
		return fmt.Errorf("%w: untagged first key holding }", admit.ErrInvalidRequest)
	}
	return Validate(first, second)
}

// hasHashTag reports whether key has a non-empty cluster hash tag.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	return strings.IndexByte(key[open+1:], '}') > 0
}

// wrongType refuses a call that names a key holding something other than a
// hash.
func (s *Server) wrongType(first admit.Request, second *admit.Request) error {
	if _, ok := s.Foreign[first.Key]; ok {
		return fmt.Errorf("%w: bucket 1 key %q", admit.ErrWrongType, first.Key)
	}
	if second != nil {
		if _, ok := s.Foreign[second.Key]; ok {
			return fmt.Errorf("%w: bucket 2 key %q", admit.ErrWrongType, second.Key)
		}
	}
	return nil
}

// AllowOrdered is admit's Limiter.AllowOrdered.
func (s *Server) AllowOrdered(first admit.Request, second *admit.Request) (Outcome, error) {
	if err := Validate(first, second); err != nil {
		return Outcome{}, err
	}
	return s.take(first, second)
}

// AllowAll is admit's Limiter.AllowAll: AllowOrdered, except that a
// second-bucket denial charges the first bucket nothing.
func (s *Server) AllowAll(first admit.Request, second *admit.Request) (Outcome, error) {
	if err := Validate(first, second); err != nil {
		return Outcome{}, err
	}
	s.expire()
	if err := s.wrongType(first, second); err != nil {
		return Outcome{}, err
	}
	d, writes := DecideAll(s.Now, s.States(), first, second)
	s.apply(writes)
	return outcome(d), nil
}

func (s *Server) take(first admit.Request, second *admit.Request) (Outcome, error) {
	s.expire()
	if err := s.wrongType(first, second); err != nil {
		return Outcome{}, err
	}
	d, writes := Decide(s.Now, s.States(), first, second)
	s.apply(writes)
	return outcome(d), nil
}

func outcome(d admit.Decision) Outcome {
	return Outcome{Denied: d.Denied, RetryAfter: d.RetryAfter, Remaining: d.Remaining, Allowed: d.Denied == 0}
}

// Peek is admit's Limiter.Peek: AllowOrdered's Outcome, and nothing
// written.
func (s *Server) Peek(first admit.Request, second *admit.Request) (Outcome, error) {
	if err := Validate(first, second); err != nil {
		return Outcome{}, err
	}
	s.expire()
	if err := s.wrongType(first, second); err != nil {
		return Outcome{}, err
	}
	d, _ := Decide(s.Now, s.States(), first, second)
	return outcome(d), nil
}

// Refund is admit's Limiter.Refund: each bucket gets its Cost back, capped
// at its burst; a missing key (a full bucket) is left missing.
func (s *Server) Refund(first admit.Request, second *admit.Request) error {
	if err := Validate(first, second); err != nil {
		return err
	}
	s.expire()
	if err := s.wrongType(first, second); err != nil {
		return err
	}
	reqs := []admit.Request{first}
	if second != nil {
		reqs = append(reqs, *second)
	}
	s.apply(Refund(s.Now, s.States(), reqs...))
	return nil
}

// AllowOrderedOnce is admit's Limiter.AllowOrderedOnce. A live record of
// (first.Key, id) is replayed (Replayed set, nothing written, its expiry
// left as it was) when it answered the same request, refused with
// admit.ErrOnceIDReused when it answered another, and refused with
// admit.ErrCorruptState when it is foreign. Otherwise the call decides as
// AllowOrdered does, and a decision that charged something (Denied 0 or 2)
// is recorded for s.Window; a first-bucket denial is not.
func (s *Server) AllowOrderedOnce(id string, first admit.Request, second *admit.Request) (Outcome, error) {
	if err := ValidateOnce(id, first, second); err != nil {
		return Outcome{}, err
	}
	s.expire()
	rid := RecordID{Key: first.Key, ID: id}
	fp := FingerprintOf(first, second)
	if r, ok := s.Records[rid]; ok {
		switch {
		case r.Foreign:
			return Outcome{}, fmt.Errorf("%w: the once-record of id %q holds a foreign value", admit.ErrCorruptState, id)
		case r.Request != fp:
			return Outcome{}, fmt.Errorf("%w: id %q", admit.ErrOnceIDReused, id)
		}
		o := r.Outcome
		o.Replayed = true
		return o, nil
	}
	o, err := s.take(first, second)
	if err != nil || !o.Charged() {
		return o, err
	}
	s.Records[rid] = Record{Outcome: o, Request: fp, ExpireAt: s.recordExpiry()}
	return o, nil
}

// recordExpiry is when a record written now is gone: SET PX Window, from
// the server's clock in whole ms on an Absolute server.
func (s *Server) recordExpiry() int64 {
	if s.Expiry == Countdown {
		return s.Now + s.Window.Microseconds()
	}
	return (s.Now/1000 + s.Window.Milliseconds()) * 1000
}

// WaitAttempt is one attempt of admit's Limiter.Wait: AllowOrdered and,
// after a second-bucket denial, the Refund of the first bucket's charge.
// On a clock that does not move, repeating it changes nothing more: each
// attempt after the first leaves the state as the first left it.
func (s *Server) WaitAttempt(first admit.Request, second *admit.Request) (Outcome, error) {
	o, err := s.AllowOrdered(first, second)
	if err == nil && o.Denied == 2 {
		err = s.Refund(first, nil)
	}
	return o, err
}

// SetForeign stores a value of another type than admit writes at key, with
// ExpireAt at, as an operator's SET would: at a bucket's name (the bucket
// is gone; calls naming it fail with admit.ErrWrongType).
func (s *Server) SetForeign(key string, at int64) {
	delete(s.Buckets, key)
	s.Foreign[key] = at
}

// SetForeignRecord stores a foreign string at the record of rid, as an
// operator's SET would.
func (s *Server) SetForeignRecord(rid RecordID, at int64) {
	s.Records[rid] = Record{Foreign: true, ExpireAt: at}
}

func cost(r admit.Request) int {
	if r.Cost == 0 {
		return 1
	}
	return r.Cost
}
