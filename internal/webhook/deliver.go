package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Sign returns the hex HMAC-SHA256, keyed by secret, of
// "<timestamp>.<body>": the value of X-Corral-Signature after "sha256=".
func Sign(secret, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// deliver posts d until it succeeds, fails for good or runs out of
// attempts, which it logs and counts. It returns false only when ctx
// ended first: d is then neither delivered nor counted.
func (s *Sender) deliver(ctx context.Context, d delivery) bool {
	for attempt := 1; ; attempt++ {
		retryAfter, retry, err := s.post(ctx, d)
		if err == nil {
			s.count("ok", 1)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !retry || attempt == s.opts.attempts {
			s.log.Warn("webhook delivery failed", "event", d.event, "delivery", d.id, "sandbox_id", d.sandboxID,
				"attempts", attempt, "err", err)
			s.count("failed", 1)
			return true
		}
		wait := min(max(s.backoff(attempt), retryAfter), s.opts.maxBackoff)
		s.log.Debug("webhook delivery will be retried", "event", d.event, "delivery", d.id, "attempt", attempt,
			"wait_ms", wait.Milliseconds(), "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// backoff is the wait after the given failed attempt: minBackoff doubled
// per attempt up to maxBackoff, less a random part of up to half, so that
// senders that failed together do not retry together.
func (s *Sender) backoff(attempt int) time.Duration {
	d := s.opts.minBackoff
	for i := 1; i < attempt && d < s.opts.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.opts.maxBackoff)
	return d - rand.N(d/2+1)
}

// post makes one attempt at d. It returns nil on a 2xx answer; otherwise
// whether to try again and, from Retry-After, how long the receiver asked
// to wait.
func (s *Sender) post(ctx context.Context, d delivery) (retryAfter time.Duration, retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.opts.URL, bytes.NewReader(d.body))
	if err != nil {
		return 0, false, errURL(err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", s.userAgent)
	req.Header.Set("X-Corral-Event", d.event)
	req.Header.Set("X-Corral-Delivery", d.id)
	req.Header.Set("X-Corral-Timestamp", ts)
	if s.opts.Secret != "" {
		req.Header.Set("X-Corral-Signature", "sha256="+Sign(s.opts.Secret, ts, d.body))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, true, errURL(err)
	}
	defer resp.Body.Close()
	// Read a little of the body, so that the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return 0, false, nil
	case c >= 500 || c == http.StatusTooManyRequests:
		return parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), true, fmt.Errorf("receiver answered %s", resp.Status)
	default:
		return 0, false, fmt.Errorf("receiver answered %s", resp.Status)
	}
}

// parseRetryAfter reads a Retry-After header, which RFC 9110 (10.2.3)
// defines as "HTTP-date / delay-seconds"; 0 when absent, invalid or past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 32); err == nil {
		return max(time.Duration(n)*time.Second, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}
