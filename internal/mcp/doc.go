// Package mcp serves Corral to agents that speak the Model Context
// Protocol: tools to run commands and code, move files, manage sandboxes
// and long-running processes, and the caller's sandboxes as resources.
//
// It is a client of the REST API through the public Go SDK, exactly like
// the CLI: every tool call is one or a few API calls made with the
// caller's credentials, so the daemon's authentication, admission and
// errors apply unchanged. It keeps no state but, per MCP session, the
// session's own sandbox (created on first use, deleted when the session
// ends) and a tag on the sandboxes the session created, which bounds how
// many it may hold (Policy.MaxSandboxes).
//
// The same Server runs over stdio (`corral mcp`, for desktop and IDE
// agents) and over the streamable HTTP transport (HTTPHandler, served by
// the daemon at /mcp). It must not reach around the API: no import of the
// Manager, drivers or storage.
package mcp
