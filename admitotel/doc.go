// Package admitotel turns admit's hooks into OpenTelemetry metrics and
// traces: [NewObserver] for admit.WithObserver, [HTTPOutcome] for
// admithttp.WithOutcome, and the grpcotel package for admitgrpc. It depends
// on OpenTelemetry's API alone; the application picks the SDK and the
// exporter.
//
// Attributes are the call's kind, its outcome and the policy names, never a
// key, an id or a client address unless [WithKeys] turns keys on: the
// series count stays bounded whatever the traffic (docs/observing.md lists
// every instrument).
package admitotel
