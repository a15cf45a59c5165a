//! The models a team can call: which adapter a route calls, the teams' own provider
//! connections and what makes one valid (`connections.rs`, T14); what each model can do
//! and costs (`catalog.rs`).

pub mod catalog;
pub mod connections;
