// Package oteltest holds delayqotel's tests: they record spans with the
// OpenTelemetry SDK (tracetest), which the delayqotel module itself does not
// require, so that a service importing delayqotel gets the OpenTelemetry API in
// its go.sum and no SDK it did not choose.
package oteltest
