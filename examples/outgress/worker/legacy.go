package worker

import (
	"context"
	"net/http"

	"github.com/admitkit/admit/examples/outgress/bus"
	"github.com/admitkit/admit/examples/outgress/limits"
)

// LegacyPrepare is Prepare with every rollout step switched off (Config.Off
// = AllSteps): the pre-HTTP path in the shape the plan replaces, which the
// demo's "old shape" column and the benchmark's baseline measure: a GET of
// the pause flag on every message, the same channel cache, and for a
// two-bucket decision two scripts in sequence, the second sent only when
// the first admitted. Warm, that is 3 round trips on the standard lane and
// 2 on the premium lane.
func (w *Worker) LegacyPrepare(ctx context.Context, lane limits.Lane, m *bus.Message) (*http.Request, Path, error) {
	return w.legacy.Prepare(ctx, lane, m)
}
