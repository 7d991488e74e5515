// Package credentials reads the Secrets the operator sends to billing providers and
// job sinks, only where a Secret opts in to that use and destination, and caches them
// for a short TTL so that a credential is not read once per settlement.
package credentials
