// Package command is the outgress worker's message format: the JSON body
// of a bus message, decoded and validated into a Command, whose Kind says
// which Helix route it takes. A body Decode refuses can never become
// valid, so the worker drops it instead of redelivering it.
package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/admitkit/admit/examples/outgress/internal/label"
)

// Kind is what a command asks the worker to do.
type Kind uint8

// The kinds. API, announcement and shoutout are the three Helix routes that
// share the Helix buckets; chat has per-channel buckets of its own.
const (
	KindChat Kind = iota
	KindAPI
	KindAnnounce
	KindShoutout
	NumKinds
)

var kindNames = [NumKinds]string{"chat", "api", "announce", "shoutout"}

// String is the kind's metric label.
func (k Kind) String() string { return label.Of(kindNames[:], k) }

// NeedsChannel reports whether the kind acts in a channel, so the worker
// must look the channel up first.
func (k Kind) NeedsChannel() bool { return k != KindAPI }

// Command is the decoded body of a bus message. Examples:
//
//	{"kind":"chat","channel":"1001","text":"hello"}
//	{"kind":"announce","channel":"1001","text":"stream starts soon","color":"blue"}
//	{"kind":"shoutout","channel":"1001","to":"1002"}
//	{"kind":"api","method":"GET","path":"/helix/users?id=1001"}
type Command struct {
	Kind    Kind
	Channel string // broadcaster id: decimal digits
	Text    string
	Color   string
	To      string // shoutout target: decimal digits
	Method  string // api only
	Path    string // api only: starts with /helix/
}

type wireCommand struct {
	Kind    string `json:"kind"`
	Channel string `json:"channel"`
	Text    string `json:"text"`
	Color   string `json:"color"`
	To      string `json:"to"`
	Method  string `json:"method"`
	Path    string `json:"path"`
}

// Limits on a command's fields: a channel id becomes part of a hash tag and a
// URL, so it must be short decimal digits.
const (
	maxIDLen   = 20
	maxTextLen = 500 // Helix's chat message limit
)

// ErrMalformed wraps every reason Decode refuses a body.
var ErrMalformed = errors.New("outgress: malformed command")

// Decode parses and validates a message body. A body it refuses will
// never become valid, so the caller drops it instead of redelivering it.
func Decode(data []byte) (Command, error) {
	var w wireCommand
	if err := json.Unmarshal(data, &w); err != nil {
		return Command{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	kind := slices.Index(kindNames[:], w.Kind) // the wire names are the kinds' names
	if kind < 0 {
		return Command{}, malformed("unknown kind")
	}
	c := Command{Kind: Kind(kind), Channel: w.Channel, Text: w.Text, Color: w.Color, To: w.To, Method: w.Method, Path: w.Path}
	if c.Kind.NeedsChannel() && !isID(c.Channel) {
		return Command{}, malformed("channel must be 1 to 20 decimal digits")
	}
	switch c.Kind {
	case KindChat, KindAnnounce:
		if c.Text == "" || len(c.Text) > maxTextLen {
			return Command{}, malformed("text must be 1 to 500 bytes")
		}
	case KindShoutout:
		if !isID(c.To) {
			return Command{}, malformed("shoutout target must be 1 to 20 decimal digits")
		}
	case KindAPI:
		switch c.Method {
		case "GET", "POST", "PATCH", "PUT", "DELETE":
		default:
			return Command{}, malformed("api method must be GET, POST, PATCH, PUT or DELETE")
		}
		if !strings.HasPrefix(c.Path, "/helix/") || strings.ContainsAny(c.Path, " \r\n#") {
			return Command{}, malformed("api path must start with /helix/")
		}
	}
	return c, nil
}

func malformed(why string) error { return fmt.Errorf("%w: %s", ErrMalformed, why) }

func isID(s string) bool {
	if s == "" || len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
