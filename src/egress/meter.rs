//! Byte counts and idleness of one upstream connection. The proxy wraps the socket it opened to
//! the origin, so a tunnel and a forwarded request are counted the same way (bytes on that
//! wire), the counts survive an idle cut or a shutdown, and one clock says when nothing moved.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

#[derive(Debug)]
pub struct Meter {
    start: Instant,
    /// Written to the upstream: the sandbox's bytes going out.
    up: AtomicU64,
    /// Read from the upstream.
    down: AtomicU64,
    /// Milliseconds after `start` of the last byte either way.
    last_ms: AtomicU64,
}

impl Meter {
    pub fn new() -> Arc<Meter> {
        Arc::new(Meter {
            start: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }

    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }

    fn moved(&self, counter: &AtomicU64, n: usize) {
        if n > 0 {
            counter.fetch_add(n as u64, Ordering::Relaxed);
            let now = self.start.elapsed().as_millis() as u64;
            self.last_ms.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Resolves once no byte has moved either way for `limit`.
    pub async fn idle(&self, limit: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(last);
            if quiet >= limit {
                return;
            }
            tokio::time::sleep(limit - quiet).await;
        }
    }
}

/// A stream whose traffic is counted on a shared meter.
pub struct Metered<S> {
    inner: S,
    meter: Arc<Meter>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, meter: Arc<Meter>) -> Self {
        Metered { inner, meter }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.meter
                .moved(&this.meter.down, buf.filled().len() - before);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            this.meter.moved(&this.meter.up, n);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.meter.moved(&this.meter.up, n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_are_counted_each_way() {
        let (a, mut b) = tokio::io::duplex(64);
        let meter = Meter::new();
        let mut a = Metered::new(a, meter.clone());
        a.write_all(b"hello").await.expect("write");
        b.write_all(b"hi").await.expect("write");
        let mut got = [0u8; 2];
        a.read_exact(&mut got).await.expect("read");
        assert_eq!((meter.up(), meter.down()), (5, 2));
    }

    #[tokio::test]
    async fn idle_waits_for_quiet_since_the_last_byte() {
        let (a, mut b) = tokio::io::duplex(64);
        let meter = Meter::new();
        let mut a = Metered::new(a, meter.clone());
        let limit = Duration::from_millis(1000);
        let idle = tokio::spawn({
            let meter = meter.clone();
            async move { meter.idle(limit).await }
        });
        tokio::time::sleep(Duration::from_millis(600)).await;
        b.write_all(b"x").await.expect("write");
        let mut got = [0u8; 1];
        a.read_exact(&mut got).await.expect("read");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!idle.is_finished(), "a byte at 0.6 s restarts the clock");
        tokio::time::timeout(Duration::from_secs(5), idle)
            .await
            .expect("idle after a quiet second")
            .expect("join");
    }
}
