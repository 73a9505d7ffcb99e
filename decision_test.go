package admit

import (
	"context"
	"errors"
	"testing"

	"github.com/valkey-io/valkey-go"
)

// TestZeroDecisionIsNotAllowed: every error comes with the zero Decision,
// and a caller that looks at the Decision before the error must fail
// closed. (Before the fix, Decision{}.Allowed() was true.)
func TestZeroDecisionIsNotAllowed(t *testing.T) {
	var d Decision
	if d.Allowed() {
		t.Error("the zero Decision reports Allowed")
	}
	if got, want := d.String(), "no decision"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	e := newUnitEnv(t)
	for _, tc := range []struct {
		name   string
		first  Request
		second *Request
	}{
		{"invalid request", Request{Key: "", Spec: perSecond3}, nil},
		{"server refusal", Request{Key: "wrong-type", Spec: perSecond3}, nil},
	} {
		e.srv.Set("wrong-type", "x")
		d, err := e.l.AllowOrdered(context.Background(), tc.first, tc.second)
		if err == nil || d.Allowed() {
			t.Errorf("%s: got %v, %v; want an error and a Decision that is not allowed", tc.name, d, err)
		}
	}
	d, err := newUnitEnvScript(t, "return '0 0 2 -1'").l.AllowOrdered(context.Background(), Request{Key: "k", Spec: perSecond3}, nil)
	if err != nil || !d.Allowed() || d.String() != "allowed" {
		t.Errorf("a server admission: got %v, %v; want allowed", d, err)
	}
}

// nothingClient is a valkey.Client on which every method panics: the nil
// interface it embeds has no methods to call.
type nothingClient struct{ valkey.Client }

// TestNewCallsNothingOnTheClient: New only stores the client, so a mock
// client needs no expectation for it. (Before the fix, New called Mode.)
func TestNewCallsNothingOnTheClient(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("New called a method of the client: %v", r)
		}
	}()
	if l := New(nothingClient{}); l == nil || l.client == nil {
		t.Fatal("New did not keep the client")
	}
	// A one-bucket call that is refused client-side touches nothing either.
	_, err := New(nothingClient{}).AllowOrdered(context.Background(), Request{}, nil)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v, want ErrInvalidRequest", err)
	}
}
