//! A request's body, read within the size limit, the body's time limit and
//! the room the intake ([`crate::intake`]) admits it to.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use hyper::StatusCode;
use hyper::body::{Body as _, Incoming};

use super::config::HttpConfig;
use super::reply::Failure;
use super::socket::ClientWatch;
use crate::api::BadRequest;
use crate::intake::{Held, Intake, Shed, UNDECLARED_FIRST_SLICE_BYTES};

/// Reads a body within the size limit and the body's time limit, once the
/// intake has admitted the request: a body that declares its length takes
/// its whole charge once its first piece has arrived and before more is
/// read; one sent without a length is admitted for a first slice and grows
/// into free room. A body whose declared length is over the limit is
/// refused before anything is read. A coding other than `identity` never
/// reaches here: the screen refuses it before routing.
///
/// A request refused room is answered 503 with `Retry-After`, holding
/// nothing, once its body has been read and thrown away: a connection
/// closed with a body unread would reset, and the client might lose the
/// answer that tells it to retry.
///
/// A request whose client hangs up while it waits for room is not read: it
/// ends with no answer anyone will receive.
pub async fn read_body(
    config: &HttpConfig,
    intake: &Intake,
    client: &ClientWatch,
    body: Incoming,
    held: &mut Held,
) -> Result<Bytes, Failure> {
    let limit = config.body_limit;
    let too_large = || Failure::from(BadRequest::too_large(format!("body: exceeds the limit of {limit} bytes")));
    let hint = body.size_hint();
    if hint.lower() > limit as u64 {
        return Err(too_large());
    }
    let declared = hint.exact().map(|length| usize::try_from(length).expect("at most the body limit"));
    let mut body = BodyReader { body, time_limit: config.limits.body, client_time_left: config.limits.body };
    // The first piece is awaited before admission: a client that declares a
    // body and sends none holds no room, only its connection's buffer.
    let first = if declared == Some(0) { None } else { body.next_chunk().await? };
    if first.is_some()
        && let Err(shed) = intake.admit(held, declared.unwrap_or(UNDECLARED_FIRST_SLICE_BYTES), || client.has_hung_up()).await
    {
        drop(first);
        if shed == Shed::Abandoned {
            return Err(Failure::Unavailable(format!("body: {shed}")));
        }
        return Err(body.refuse(shed, limit).await);
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let mut next = first;
    while let Some(chunk) = next.take() {
        total += chunk.len();
        if total > limit {
            return Err(too_large());
        }
        if declared.is_none()
            && let Err(shed) = intake.grow(held, total)
        {
            drop(chunks);
            *held = Held::default();
            return Err(body.refuse(shed, limit).await);
        }
        chunks.push(chunk);
        next = body.next_chunk().await?;
    }
    Ok(without_byte_order_mark(concat(chunks, total)))
}

/// A request's body, read within its time limit, which counts only the
/// waits for the client's bytes.
struct BodyReader {
    body: Incoming,
    time_limit: std::time::Duration,
    client_time_left: std::time::Duration,
}

impl BodyReader {
    /// The next piece of the body, `None` at its end; 408 once the client's
    /// time is spent.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, Failure> {
        loop {
            let waited_from = tokio::time::Instant::now();
            let frame = match tokio::time::timeout(self.client_time_left, self.body.frame()).await {
                Err(_) => {
                    return Err(Failure::Status(
                        StatusCode::REQUEST_TIMEOUT,
                        format!("body: not received within {} s", self.time_limit.as_secs_f64()),
                    ));
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(error))) => return Err(BadRequest::new(format!("body: could not be read ({error})")).into()),
                Ok(Some(Ok(frame))) => frame,
            };
            self.client_time_left = self.client_time_left.saturating_sub(waited_from.elapsed());
            if let Ok(chunk) = frame.into_data() {
                return Ok(Some(chunk));
            }
        }
    }

    /// The answer to a request refused room, once the rest of its body (at
    /// most `limit` bytes, within its time limit) has been read and thrown
    /// away. A body that does not end in time closes the connection instead.
    async fn refuse(mut self, shed: Shed, limit: usize) -> Failure {
        let mut total = 0usize;
        while let Ok(Some(chunk)) = self.next_chunk().await {
            total += chunk.len();
            if total > limit {
                break;
            }
        }
        Failure::Unavailable(format!("body: {shed}"))
    }
}

/// A body less the UTF-8 byte order mark it may start with. JSON sent over a
/// network must not carry one, but some clients' encoders write it, and RFC
/// 8259 lets a parser ignore it; refusing it would refuse their every request.
fn without_byte_order_mark(body: Bytes) -> Bytes {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    if body.starts_with(BOM) { body.slice(BOM.len()..) } else { body }
}

/// One buffer of a body's pieces: the piece itself when there is one.
fn concat(mut chunks: Vec<Bytes>, total: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().expect("one chunk");
    }
    let mut joined = BytesMut::with_capacity(total);
    for chunk in chunks {
        joined.extend_from_slice(&chunk);
    }
    joined.freeze()
}
