//! The WebSocket transport with real rmcp peers on loopback: the worker's role (server)
//! over a dialed socket, the brain's role (client) over an accepted one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use channel::ws::{ChannelEnd, split};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolRequestParams, ServerCapabilities, ServerConfig};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use tokio::net::TcpListener;

#[derive(Clone)]
struct Echo {
    tool_router: ToolRouter<Self>,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    text: String,
}

#[tool_router]
impl Echo {
    #[tool(description = "Echo the text")]
    async fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        format!("echo: {text}")
    }
}

// The router built once at construction serves every call.
#[tool_handler(router = self.tool_router)]
impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::test]
async fn mcp_runs_over_the_socket_and_a_close_frame_says_why() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // The brain side accepts and is the MCP client.
    let brain = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let (sink, stream, control) = split::<RoleClient, _>(ws);
        let client = ().serve((sink, stream)).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        assert_eq!(tools.len(), 1);
        let args = serde_json::json!({"text": "hi"}).as_object().cloned();
        let result = client
            .call_tool(CallToolRequestParams::new("echo").with_arguments(args.unwrap()))
            .await
            .unwrap();
        let text = serde_json::to_value(&result.content).unwrap().to_string();
        assert!(text.contains("echo: hi"), "{text}");
        control.ping().await.unwrap();
        control.close(4005, "session_ended").await;
        control
    });
    // The worker side dials and is the MCP server.
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let (sink, stream, worker_control) = split::<RoleServer, _>(ws);
    let server = Echo {
        tool_router: Echo::tool_router(),
    }
    .serve((sink, stream))
    .await
    .unwrap();
    let brain_control = brain.await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(2), worker_control.ended())
        .await
        .unwrap();
    assert_eq!(
        end,
        ChannelEnd::Closed {
            code: 4005,
            reason: "session_ended".into()
        }
    );
    // The server's session ends with the stream.
    tokio::time::timeout(Duration::from_secs(2), server.waiting())
        .await
        .unwrap()
        .unwrap();
    drop(brain_control);
}

#[tokio::test]
async fn a_frame_that_is_not_json_rpc_ends_the_channel_visibly() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use futures_util::SinkExt;
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::text("not json"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let (_sink, stream, control) = split::<RoleServer, _>(ws);
    let drain = tokio::spawn(async move {
        use futures_util::StreamExt;
        stream.count().await
    });
    let end = tokio::time::timeout(Duration::from_secs(2), control.ended())
        .await
        .unwrap();
    assert_eq!(end, ChannelEnd::Undecodable);
    assert_eq!(drain.await.unwrap(), 0);
}
