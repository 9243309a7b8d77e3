//! NATS JetStream as a deduplicating log: a `nats-server -js` of the
//! benchmark's own (its own port and store directory), one file-backed
//! stream whose duplicate window stands for stile's, a subject per
//! partition, and each message published with `Nats-Msg-Id` set to its
//! transactionId, its ack awaited.
//!
//! JetStream keeps the ids of its window in the server's memory, and its
//! file store writes to the page cache and syncs to disk every two minutes
//! by default: an acknowledged message can be lost if the machine (not
//! only the process) fails in between.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt as _;
use stile_tests::gateway::Process;

/// A running server with one stream.
#[derive(Debug)]
pub struct JetStream {
    process: Process,
    url: String,
    stream: String,
    subjects: String,
    /// The store directory, removed when the server is dropped.
    store: PathBuf,
}

impl JetStream {
    /// Starts `nats-server -js` on a port it picks, with a fresh store
    /// directory, and creates the stream `name` over `{name}.>` with a
    /// duplicate window of `window`.
    pub async fn start(name: &str, window: Duration) -> JetStream {
        let store = std::env::temp_dir().join(format!("stile-peers-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store).expect("create the JetStream store directory");
        let mut command = Command::new(std::env::var("STILE_NATS_SERVER").unwrap_or_else(|_| "nats-server".into()));
        command.args(["-js", "-a", "127.0.0.1", "-p", "-1", "-sd"]).arg(&store);
        let (process, url) = Process::start_until(command, |line| {
            let (_, addr) = line.split_once("Listening for client connections on ")?;
            Some(format!("nats://{}", addr.trim()))
        })
        .await;
        let js = JetStream { process, url, stream: name.to_owned(), subjects: format!("{name}.>"), store };
        let context = js.context().await;
        context
            .create_stream(stream::Config {
                name: js.stream.clone(),
                subjects: vec![js.subjects.clone()],
                storage: stream::StorageType::File,
                duplicate_window: window,
                ..Default::default()
            })
            .await
            .expect("create the JetStream stream");
        js
    }

    /// A connection of its own with a JetStream context on it.
    pub async fn context(&self) -> jetstream::Context {
        let client = async_nats::connect(&self.url).await.unwrap_or_else(|e| panic!("connect to {}: {e}", self.url));
        jetstream::new(client)
    }

    /// The subject standing for partition `p`.
    pub fn subject(&self, partition: usize) -> String {
        format!("{}.p{partition}", self.stream)
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.process.pid()).expect("a pid fits i32")
    }

    /// Every stored message's `Nats-Msg-Id`, counted: read through an
    /// ordered consumer that delivers headers only.
    pub async fn stored_ids(&self) -> HashMap<String, u32> {
        let context = self.context().await;
        let mut stream = context.get_stream(&self.stream).await.expect("the stream");
        let total = stream.info().await.expect("the stream's state").state.messages;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig { headers_only: true, ..Default::default() })
            .await
            .expect("an ordered consumer");
        let mut messages = consumer.messages().await.expect("the consumer's messages");
        let mut ids: HashMap<String, u32> = HashMap::with_capacity(total as usize);
        let mut read = 0u64;
        while read < total {
            let message = messages.next().await.expect("a message before the end").expect("a message");
            let id = message.headers.as_ref().and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID)).map(|v| v.to_string());
            *ids.entry(id.unwrap_or_default()).or_default() += 1;
            read += 1;
        }
        ids
    }
}

impl Drop for JetStream {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Publishes one message per id to `subject`, all before the first ack is
/// awaited, and answers for each whether the stream took it as new.
pub async fn publish(
    context: &jetstream::Context,
    subject: &str,
    ids: &[String],
    payload: &Bytes,
) -> Result<Vec<bool>, async_nats::Error> {
    let mut acks = Vec::with_capacity(ids.len());
    for id in ids {
        let message = jetstream::message::PublishMessage::build().message_id(id).payload(payload.clone());
        acks.push(context.send_publish(subject.to_owned(), message).await?);
    }
    let mut new = Vec::with_capacity(ids.len());
    for ack in acks {
        new.push(!ack.await?.duplicate);
    }
    Ok(new)
}
