//! HTTP and store tests against the real app, on the embedded store and on DynamoDB Local.
//! One binary, so one DynamoDB Local serves the whole run.

mod azurite;
mod dynamo_local;
mod launcher;
#[macro_use]
mod helpers;

mod after;
mod auth;
mod azure_conformance;
mod backpressure;
mod browser;
mod conformance;
mod connections;
mod console;
mod convergence;
mod edits;
mod envelope;
mod errors;
mod fanout;
mod following;
mod import;
mod latest;
mod lifecycle;
mod limits;
mod line_protocol;
mod markers;
mod mqtt;
mod notifications;
mod openapi;
mod overview;
mod posting;
mod readings;
mod readme;
mod reliability;
mod restart;
mod retention;
mod rollups;
mod series;
mod startup;
mod streams;
mod timeline;
