// Package webhook posts sandbox lifecycle events to an operator's HTTP
// endpoint (`corral server --webhook URL`).
//
// A Sender subscribes to the Manager's event bus and delivers each sandbox
// event to one URL as one JSON object (Payload) in one POST, in the order
// of the bus, from a bounded in-memory queue. It owns that queue, the
// delivery of each request with its retries, and the signature. It must not
// block the bus or the API (a full queue drops its oldest delivery), make
// sandbox decisions, or persist anything: deliveries still queued when the
// daemon stops are lost, and events published while no Sender reads the
// bus are not replayed.
//
// # Events
//
// The bus's types are sent under these names: created, running, paused,
// resumed, stopped, started, deleted, oom_killed; timeout as "expired" (a
// "deleted" follows) and error as "failed" (the sandbox entered the error
// state; the payload's error says why). oom_killed says the kernel killed
// a process of the sandbox, or the whole sandbox, for going past its
// memory limit: once per kill the daemon learns of, when an exec's process
// dies of it or the sandbox's instance does (a "failed" follows). Stream-level
// bus events, without a sandbox ID, are not sent.
//
// # Requests
//
// Every request carries these headers:
//
//	Content-Type: application/json
//	User-Agent: corral/<version>
//	X-Corral-Event: <event name>
//	X-Corral-Delivery: <delivery id, the payload's id>
//	X-Corral-Timestamp: <Unix time of this attempt, in seconds>
//	X-Corral-Signature: sha256=<hex>   (with a secret only)
//
// The signature is the lowercase hex HMAC-SHA256, keyed by the secret, of
// the timestamp header's value, a full stop and the request body, byte for
// byte:
//
//	HMAC-SHA256(secret, "<X-Corral-Timestamp>.<body>")
//
// A receiver recomputes it over the body it read, compares in constant
// time, and rejects a timestamp too far from its own clock (five minutes
// is usual) to refuse replays. A retry carries the same delivery ID and
// body with a new timestamp and signature, so receivers deduplicate by ID.
//
// # Delivery
//
// A 2xx answer is success. A network error, a timeout (10 s per request),
// 5xx or 429 is retried with exponential backoff and jitter, from 1 s
// doubling to 1 min, waiting at least what Retry-After asks for (up to that
// minute), 8 attempts in all. Any other answer, redirects included (they are
// not followed), fails the delivery at once. Failures and drops are logged
// and counted, never returned to the publisher.
package webhook
