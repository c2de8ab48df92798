//! A connection whose answers the client stops reading: hyper has no timer on writes, so a
//! client that pipelines requests and never reads the answers (a "slow read") would hold its
//! connection, and its place under the connection caps, for as long as it likes. [`Stalled`]
//! fails a write (or flush) that has made no progress for its limit, and hyper then closes the
//! connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An I/O stream whose writes fail once they have waited `limit` without progress.
pub(super) struct Stalled<IO> {
    io: IO,
    limit: Duration,
    /// Armed when a write first waits; cleared by any write that goes through.
    since: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Stalled<IO> {
    pub(super) fn new(io: IO, limit: Duration) -> Self {
        Self {
            io,
            limit,
            since: None,
        }
    }

    /// What a write that `polled` as it did answers: its outcome if it went through, else a
    /// wait, or an error once the writes have waited `limit` in a row.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.since = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing of its answer for {} s",
                    limit.as_secs_f64()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stalled<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stalled<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.progress(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::Stalled;
    use std::time::Duration;

    /// Over an in-memory pipe of 64 bytes: a reader that keeps up gets everything, though it
    /// takes longer in all than the limit; a write nobody reads fails as timed out.
    #[tokio::test]
    async fn a_write_fails_only_when_nobody_reads_for_the_limit() {
        let (near, mut far) = tokio::io::duplex(64);
        let limit = Duration::from_secs(2);
        let mut stalled = Stalled::new(near, limit);
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 64 * 20];
            for chunk in got.chunks_mut(64) {
                // Slower than the limit in total, far from it between pieces.
                tokio::time::sleep(Duration::from_millis(150)).await;
                far.read_exact(chunk).await.expect("read");
            }
            (got, far)
        });
        let sent: Vec<u8> = (0..64 * 20).map(|i| (i % 251) as u8).collect();
        stalled
            .write_all(&sent)
            .await
            .expect("a reader that keeps up");
        let (got, far) = reader.await.expect("reader");
        assert_eq!(got, sent);
        // Nobody reads any more: the pipe fills, and the write fails.
        let error = stalled
            .write_all(&[7u8; 1024])
            .await
            .expect_err("a write nobody reads fails");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        drop(far);
    }
}
