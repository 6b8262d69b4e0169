//! Tunnel health from probes sent through the tunnel: connected / connecting / error and RTT.
//!
//! Pure state: the gateway feeds it events with the time they happened.

use std::time::Duration;

use tokio::time::Instant;

pub use tandem_netspec::status::TunnelState;

/// Probe bookkeeping.
#[derive(Debug, Clone)]
pub struct Health {
    timeout: Duration,
    next_seq: u16,
    /// Probes in flight: sequence number and send time (a few at most).
    in_flight: Vec<(u16, Instant)>,
    last_reply: Option<Instant>,
    rtt: Option<Duration>,
}

impl Health {
    /// Health that declares the tunnel lost when no probe is answered for `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            next_seq: 0,
            in_flight: Vec::new(),
            last_reply: None,
            rtt: None,
        }
    }

    /// Records a probe sent at `now` and returns its sequence number.
    pub fn probe_sent(&mut self, now: Instant) -> u16 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        // Forget probes older than the timeout: their replies no longer tell anything.
        self.in_flight
            .retain(|(_, sent)| now.duration_since(*sent) < self.timeout);
        self.in_flight.push((seq, now));
        seq
    }

    /// Records a reply; returns the RTT if it answers a probe still in flight.
    pub fn reply_received(&mut self, seq: u16, now: Instant) -> Option<Duration> {
        let pos = self.in_flight.iter().position(|(s, _)| *s == seq)?;
        let (_, sent) = self.in_flight.swap_remove(pos);
        let rtt = now.duration_since(sent);
        self.last_reply = Some(now);
        self.rtt = Some(rtt);
        Some(rtt)
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> TunnelState {
        match self.last_reply {
            None => TunnelState::Connecting,
            Some(t) if now.duration_since(t) <= self.timeout => TunnelState::Connected,
            Some(_) => TunnelState::Error,
        }
    }

    /// The RTT of the last answered probe, while connected.
    pub fn rtt(&self, now: Instant) -> Option<Duration> {
        (self.state(now) == TunnelState::Connected)
            .then_some(self.rtt)
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_over_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut h = Health::new(ms(1500));
        assert_eq!(h.state(t0), TunnelState::Connecting);

        let seq = h.probe_sent(t0);
        assert_eq!(h.reply_received(seq, t0 + ms(3)), Some(ms(3)));
        assert_eq!(h.state(t0 + ms(3)), TunnelState::Connected);
        assert_eq!(h.rtt(t0 + ms(3)), Some(ms(3)));

        // Duplicate or unknown replies do not count.
        assert_eq!(h.reply_received(seq, t0 + ms(4)), None);
        assert_eq!(h.reply_received(999, t0 + ms(4)), None);

        // Replies stop: still connected within the timeout, error after it.
        h.probe_sent(t0 + ms(500));
        assert_eq!(h.state(t0 + ms(1500)), TunnelState::Connected);
        assert_eq!(h.state(t0 + ms(1504)), TunnelState::Error);
        assert_eq!(h.rtt(t0 + ms(1504)), None);

        // A late reply to a probe older than the timeout is ignored.
        let late = h.probe_sent(t0 + ms(2000));
        h.probe_sent(t0 + ms(4000));
        assert_eq!(h.reply_received(late, t0 + ms(4001)), None);

        // Recovery.
        let seq = h.probe_sent(t0 + ms(5000));
        h.reply_received(seq, t0 + ms(5010));
        assert_eq!(h.state(t0 + ms(5010)), TunnelState::Connected);
        assert_eq!(h.rtt(t0 + ms(5010)), Some(ms(10)));
    }
}
