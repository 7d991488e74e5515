// Package webhookevent is the WebhookEvent reconciler: it dispatches an event's facts
// to their records (a JobCompletion, BillingSettlements), orders completions of one
// job, mirrors the children's states into the event's phase, and applies retention
// (docs/design.md §5).
package webhookevent
