// Package e2b serves E2B's API on top of the sandbox Manager, so that code
// written for the official E2B SDKs runs against Corral with nothing changed
// but E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
//
// It owns two surfaces, told apart per request:
//
//   - the control plane (E2B's REST API: create, get, list, kill, timeouts,
//     metrics), authenticated with the daemon's API key in X-API-Key;
//   - the in-sandbox API that E2B's agent "envd" serves on port 49983: the
//     Connect-protocol services process.Process and filesystem.Filesystem
//     (JSON and binary protobuf, unary and server-streaming) and the /files
//     upload and download endpoints. A request belongs to it when it names a
//     sandbox in the E2b-Sandbox-Id header or in a host name of the form
//     49983-<id>.<domain>; it is authenticated with the per-sandbox access
//     token returned at creation (X-Access-Token) or with the API key.
//
// Every envd call is translated into calls of the Manager and of the
// sandbox's agent client; the package keeps no sandbox state of its own
// beyond the polling watchers of CreateWatcher. It must not reach around
// the Manager (drivers, storage, the store) and must not change Corral's
// semantics to fit E2B's: where Corral cannot do what a call asks, the call
// fails with E2B's error shape and a message that names the limit.
package e2b
