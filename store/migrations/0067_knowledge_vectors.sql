-- Hybrid knowledge search (B6): a passage's embedding, kept without any extension (this
-- deployment's Postgres has no pgvector).
--
-- `embedding_bits` is the vector's sign quantisation (one bit a dimension, 1 for a
-- positive component): candidates are the passages at the smallest Hamming distance,
-- `bit_count(embedding_bits # query_bits)`, a sequential scan of a few bytes a passage.
-- `embedding` is the full vector (little-endian f32s) the candidates are re-scored with,
-- exactly, by the brain. Both are NULL for a passage indexed without an embedding route
-- or whose embedding failed; they go with their passage, which goes with its document.
ALTER TABLE knowledge_chunks
    ADD COLUMN embedding_bits bit varying CHECK (length(embedding_bits) BETWEEN 1 AND 8192),
    ADD COLUMN embedding bytea CHECK (octet_length(embedding) = 4 * length(embedding_bits));

-- The route that embedded the document's passages (its vectors are compared only with a
-- query embedded by the same route), or why they were not embedded: the document is then
-- searched by its words alone.
ALTER TABLE knowledge_documents
    ADD COLUMN embedding_model text CHECK (octet_length(embedding_model) <= 300),
    ADD COLUMN embedding_error text CHECK (octet_length(embedding_error) <= 1000);

-- An embedding made by the indexer belongs to no agent's turn: its usage event names the
-- team alone.
ALTER TABLE billing_events ALTER COLUMN agent_id DROP NOT NULL;
