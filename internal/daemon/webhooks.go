package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/webhook"
)

// webhookCloseTimeout bounds how long a stopping daemon keeps delivering
// queued webhook events.
const webhookCloseTimeout = 5 * time.Second

// checkWebhooks refuses a --webhook that is not an http or https URL
// with a host.
func (c *Config) checkWebhooks() error {
	for _, u := range c.Webhooks {
		if err := webhook.CheckURL(u); err != nil {
			return fmt.Errorf("--webhook: %w", err)
		}
	}
	return nil
}

// startWebhooks starts a webhook.Sender per configured URL on bus, with
// one metric family for all of them.
func (d *Daemon) startWebhooks(bus *events.Bus) error {
	if len(d.cfg.Webhooks) == 0 {
		return nil
	}
	deliveries := d.metrics.Counter("corral_webhook_deliveries_total",
		"Webhook deliveries by result: ok, failed (refused or out of attempts), dropped (queue full, or left at shutdown).", "result")
	for _, u := range d.cfg.Webhooks {
		s, err := webhook.New(bus, webhook.Options{URL: u, Secret: d.cfg.WebhookSecret, Version: d.cfg.Version,
			Deliveries: deliveries, Logger: d.log})
		if err != nil {
			return err
		}
		d.webhooks = append(d.webhooks, s)
	}
	return nil
}

// closeWebhooks stops every Sender, giving them together at most
// webhookCloseTimeout to deliver what they hold.
func (d *Daemon) closeWebhooks(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, webhookCloseTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range d.webhooks {
		wg.Go(func() {
			if err := s.Close(ctx); err != nil {
				d.log.Warn("stopping webhook", "err", err)
			}
		})
	}
	wg.Wait()
}
