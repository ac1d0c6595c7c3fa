package agentserver

// MaxSpawnThreads is maxSpawnThreads, for the binary's tests.
const MaxSpawnThreads = maxSpawnThreads
