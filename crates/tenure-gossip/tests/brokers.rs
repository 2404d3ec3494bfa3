//! The transports against real, throwaway Redis and RabbitMQ servers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_gossip::{Client, Config, Event, Handler, Handlers, Job, Worker, connect};
use tenure_testkit::servers::{self, Kind};
use tokio::task::JoinHandle;

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, String)>>>);

#[async_trait]
impl Handler for Recorder {
    async fn start(&self, job: &Job) -> Result<Option<JoinHandle<()>>, String> {
        self.0.lock().unwrap().push((job.election.clone(), job.worker.clone()));
        Ok(None)
    }
}

fn config(id: &str) -> Config {
    Config {
        id: id.into(),
        heartbeat: Duration::from_millis(200),
        lost_after: Duration::from_millis(1500),
        join_wait: Duration::from_millis(200),
        election_timeout: Duration::from_millis(500),
        ..Config::default()
    }
}

async fn three_workers_agree(url: &str) {
    let transport = connect(url, "agree").unwrap();
    let rec = Recorder::default();
    let mut workers = Vec::new();
    let mut events = Vec::new();
    for i in 1..=3 {
        let mut handlers = Handlers::new();
        handlers.insert("job", rec.clone()).unwrap();
        let mut w = Worker::start(transport.clone(), config(&format!("w{i}.1")), handlers, None).await.unwrap();
        events.push(w.events());
        workers.push(w);
    }
    assert_eq!(workers[2].members().await.unwrap(), ["w1.1", "w2.1", "w3.1"]);
    let client = Client::connect(transport.clone()).await.unwrap();
    let members = client.members(Duration::from_millis(500)).await.unwrap();
    assert_eq!(members.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["w1.1", "w2.1", "w3.1"]);
    let mut winners = Vec::new();
    for n in 0..20 {
        let o = client.elect(&format!("e{n}"), "job", "", Duration::from_secs(10)).await.unwrap();
        assert!(o.started, "{o:?}");
        winners.push((format!("e{n}"), o.winner.unwrap()));
    }
    // A handler is started before its outcome is sent, so every run is recorded by now.
    let mut ran = rec.0.lock().unwrap().clone();
    ran.sort();
    winners.sort();
    assert_eq!(ran, winners, "each election ran once, on its winner");
    for ev in &mut events {
        // Each worker decides in its own time: wait for all 20 decisions.
        let mut decided = Vec::new();
        while decided.len() < winners.len() {
            let e = tokio::time::timeout(Duration::from_secs(10), ev.recv()).await.expect("20 decisions").unwrap();
            if let Event::Decided(d) = e {
                decided.push((d.election, d.winner.unwrap()));
            }
        }
        decided.sort();
        assert_eq!(decided, winners);
    }
    for w in workers {
        w.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_three_workers_agree() {
    let Some(server) = servers::launch(Kind::Redis) else { return };
    three_workers_agree(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_three_workers_agree() {
    let Some(server) = servers::launch(Kind::RabbitMq) else { return };
    three_workers_agree(&server.url()).await;
}

async fn survives_a_broker_restart(mut server: servers::Server) {
    let transport = connect(&server.url(), "restart").unwrap();
    let rec = Recorder::default();
    let mut handlers = Handlers::new();
    handlers.insert("job", rec.clone()).unwrap();
    let mut w = Worker::start(transport.clone(), config("w.1"), handlers, None).await.unwrap();
    let mut events = w.events();
    server.restart();
    // The worker notices, reconnects and joins again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut lost = false;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await.expect("no rejoin within 30 s").unwrap() {
            Event::LinkLost => lost = true,
            Event::Joined { .. } if lost => break,
            _ => {}
        }
    }
    let client = Client::connect(transport.clone()).await.unwrap();
    let o = client.elect("after-restart", "job", "", Duration::from_secs(10)).await.unwrap();
    assert_eq!(o.winner.as_deref(), Some("w.1"));
    w.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_worker_survives_a_broker_restart() {
    let Some(server) = servers::launch(Kind::Redis) else { return };
    survives_a_broker_restart(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_worker_survives_a_broker_restart() {
    let Some(server) = servers::launch(Kind::RabbitMq) else { return };
    survives_a_broker_restart(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_and_unreachable_brokers_are_clear_errors() {
    let port = servers::free_port();
    for url in [format!("redis://127.0.0.1:{port}"), format!("amqp://guest:guest@127.0.0.1:{port}")] {
        let e = Worker::start(connect(&url, "g").unwrap(), config("w.1"), Handlers::new(), None).await.err().unwrap();
        let text = format!("{e}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    }
    if let Some(rabbit) = servers::launch(Kind::RabbitMq) {
        let url = rabbit.url().replace("guest:guest", "guest:Xq7-not-it");
        let e = Worker::start(connect(&url, "g").unwrap(), config("w.1"), Handlers::new(), None).await.err().unwrap();
        let text = tenure_chain(&e);
        assert!(text.contains("guest:***"), "the password is not shown: {text}");
        assert!(!text.contains("Xq7-not-it"), "{text}");
        assert!(text.contains("wrong user, password or virtual host"), "{text}");
    }
    if let Some(redis) = servers::launch_with(Kind::Redis, Some("right")) {
        let url = format!("redis://:Xq7-not-it@127.0.0.1:{}", redis.port());
        let e = Worker::start(connect(&url, "g").unwrap(), config("w.1"), Handlers::new(), None).await.err().unwrap();
        let text = tenure_chain(&e);
        assert!(text.to_lowercase().contains("auth") || text.contains("WRONGPASS"), "{text}");
        assert!(!text.contains("Xq7-not-it"), "{text}");
    }
}

fn tenure_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
