package command

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeCommand(t *testing.T) {
	long := strings.Repeat("x", 501)
	for _, c := range []struct {
		body string
		kind Kind // when valid
		ok   bool
	}{
		{`{"kind":"chat","channel":"42","text":"hi"}`, KindChat, true},
		{`{"kind":"announce","channel":"42","text":"hi","color":"blue"}`, KindAnnounce, true},
		{`{"kind":"shoutout","channel":"42","to":"43"}`, KindShoutout, true},
		{`{"kind":"api","method":"GET","path":"/helix/users?id=1"}`, KindAPI, true},
		{`not json`, 0, false},
		{`{"kind":"dance","channel":"42"}`, 0, false},
		{`{"kind":"CHAT","channel":"42","text":"hi"}`, 0, false},    // the names are exact
		{`{"kind":"invalid","channel":"42","text":"hi"}`, 0, false}, // String of no kind
		{`{"channel":"42","text":"hi"}`, 0, false},
		{`{"kind":"chat","channel":"4}2","text":"hi"}`, 0, false}, // would break the hash tag
		{`{"kind":"chat","channel":"{42}","text":"hi"}`, 0, false},
		{`{"kind":"chat","channel":"123456789012345678901","text":"hi"}`, 0, false},
		{`{"kind":"chat","channel":"","text":"hi"}`, 0, false},
		{`{"kind":"chat","channel":"42","text":""}`, 0, false},
		{`{"kind":"chat","channel":"42","text":"` + long + `"}`, 0, false},
		{`{"kind":"shoutout","channel":"42","to":"x"}`, 0, false},
		{`{"kind":"api","method":"TRACE","path":"/helix/users"}`, 0, false},
		{`{"kind":"api","method":"GET","path":"https://elsewhere/helix/"}`, 0, false},
		{`{"kind":"api","method":"GET","path":"/helix/a b"}`, 0, false},
	} {
		cmd, err := Decode([]byte(c.body))
		switch {
		case c.ok && (err != nil || cmd.Kind != c.kind):
			t.Errorf("%s: %v, %v; want kind %v", c.body, cmd.Kind, err, c.kind)
		case !c.ok && !errors.Is(err, ErrMalformed):
			t.Errorf("%s: %v; want ErrMalformed", c.body, err)
		}
	}
}
