// Package audit keeps the daemon's audit log: one JSON record per line for
// every mutating API call and every command started in a sandbox, in
// files under one directory that rotate by size, and the queries that read
// them back, filtered, and follow what is appended next.
//
// A record is written to the file, with one write(2) on a file opened with
// O_APPEND, before Append returns: a record Append acknowledged survives
// the daemon crashing, since the kernel holds it. It is not synced to the
// disk, so a power loss may lose the last records: an fsync per record
// would add the disk's flush latency, milliseconds, to every API call. When
// a record cannot be written (the disk is full), Append says so, and the
// caller refuses the call it was to record rather than run it unaudited.
//
// It stores and reads records; it knows nothing of HTTP, tenants' rules or
// the sandbox Manager. Which calls are recorded, what a record holds, who
// may read which records and how they reach a client are its callers'
// business.
package audit
