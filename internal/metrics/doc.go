// Package metrics declares the operator's Prometheus metrics, the list registered
// with controller-runtime's registry, and the collector that counts objects by state
// from the informer cache. Labels name namespaces and providers, never keys or
// customers.
package metrics
