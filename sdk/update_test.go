package corral

import (
	"encoding/json"
	"testing"
	"time"
)

func TestUpdateOptionsJSON(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts UpdateOptions
		want string
	}{
		{"limits", UpdateOptions{CPUs: 1.5, MemoryMB: 256}, `{"cpus":1.5,"memory_mb":256}`},
		{"idle in seconds", UpdateOptions{IdleTimeout: Timeout(90 * time.Second), OnIdle: ActionPause}, `{"on_idle":"pause","idle_timeout":90}`},
		{"idle off", UpdateOptions{IdleTimeout: Timeout(0)}, `{"idle_timeout":0}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Fatalf("got %s, want %s", b, tt.want)
			}
		})
	}
}
