// Package label names the values of outgress's enums, each a uint8 that
// counts up from 0 and whose String is a fixed metric label.
package label

// Of is names[v], or "invalid" when v has no name: the String of an enum
// whose values are the indexes of names.
func Of[T ~uint8](names []string, v T) string {
	if int(v) < len(names) {
		return names[v]
	}
	return "invalid"
}
