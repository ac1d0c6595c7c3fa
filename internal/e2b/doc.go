// Package e2b serves E2B's API on top of the sandbox Manager, so that code
// written for the official E2B SDKs runs against Corral with nothing changed
// but E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
//
// It owns three surfaces, told apart per request:
//
//   - the control plane (E2B's REST API: create, get, list, kill, timeouts,
//     metrics, volumes), authenticated with the daemon's API key in
//     X-API-Key;
//   - E2B's volume content API under /volumecontent/ (a named volume's
//     files, without a sandbox), authenticated with the volume's token,
//     returned by the control plane, as a bearer token, or the API key;
//   - the in-sandbox API that E2B's agent "envd" serves on port 49983: the
//     Connect-protocol services process.Process and filesystem.Filesystem
//     (JSON and binary protobuf, unary and server-streaming) and the /files
//     upload and download endpoints. A request belongs to it when it names a
//     sandbox in the E2b-Sandbox-Id header or in a host name of the form
//     49983-<id>.<domain>; it is authenticated with the per-sandbox access
//     token returned at creation (X-Access-Token) or with the API key.
//
// The envd services are connect-go handlers of the code generated in
// envdpb from Corral's own description of E2B's protocol.
//
// Every envd call is translated into calls of the Manager and of the
// sandbox's agent client; the package keeps no sandbox state of its own
// beyond the polling watchers of CreateWatcher; an E2B volume is the
// Corral volume of the same name. It must not reach around the Manager
// (drivers, storage, the store) and must not change Corral's semantics to
// fit E2B's: where Corral cannot do what a call asks, the call fails with
// E2B's error shape and a message that names the limit.
package e2b
