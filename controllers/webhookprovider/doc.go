// Package webhookprovider is the WebhookProvider reconciler: it reports whether a
// provider can receive (its Secret, routes, job sink and billing providers) and
// schedules its events' retention sweep.
package webhookprovider
