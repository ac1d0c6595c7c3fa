// Package secrets owns the secrets tenants keep for their sandboxes'
// egress: values a sandbox uses without ever holding them, because the
// daemon's proxy adds them to requests on the way out. A secret is named
// per tenant, encrypted at rest with AES-256-GCM under a key file of the
// state directory, and stored as a ciphertext in the records store.
//
// It stores, encrypts and answers; it does not decide who may act for a
// tenant (internal/server passes the caller's tenant), speak HTTP, or
// rewrite requests (the egress proxy asks Source for a value). A value
// leaves this package only through Store.Value and Source, for the
// daemon's own use: never in a listing, an error or a log.
package secrets
