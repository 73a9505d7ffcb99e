package label

import "testing"

func TestOf(t *testing.T) {
	type color uint8
	names := []string{"red", "green"}
	for _, c := range []struct {
		v    color
		want string
	}{{0, "red"}, {1, "green"}, {2, "invalid"}, {255, "invalid"}} {
		if got := Of(names, c.v); got != c.want {
			t.Errorf("Of(%q, %d) = %q, want %q", names, c.v, got, c.want)
		}
	}
}
