// Artifacts named in a tool's result ("stored artifact <id> (name, N bytes)"): fetched
// with the bearer key (an <img src> could not send it) and shown through object URLs,
// inline for images, as a download otherwise.

import { useEffect, useState } from "react";
import { type Api, type ArtifactMeta, explain, ApiError } from "./api";

const ARTIFACT = /stored artifact ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/g;

export function artifactIds(text: string): string[] {
  return [...new Set([...text.matchAll(ARTIFACT)].map((m) => m[1]))];
}

export function Artifact({ api, id }: { api: Api; id: string }) {
  const [meta, setMeta] = useState<ArtifactMeta>();
  const [url, setUrl] = useState<string>();
  const [problem, setProblem] = useState<string>();
  useEffect(() => {
    let live = true;
    let objectUrl: string | undefined;
    (async () => {
      try {
        const m = await api.artifactMeta(id);
        const blob = await api.artifactBlob(id);
        objectUrl = URL.createObjectURL(blob);
        if (live) {
          setMeta(m);
          setUrl(objectUrl);
        }
      } catch (e) {
        if (live) setProblem(e instanceof ApiError ? explain(e) : "the artifact could not be loaded");
      }
    })();
    return () => {
      live = false;
      if (objectUrl) URL.revokeObjectURL(objectUrl);
    };
  }, [api, id]);
  if (problem) return <p className="error">Artifact {id}: {problem}</p>;
  if (!meta || !url) return <p className="status">Loading artifact…</p>;
  if (/^image\/(png|jpeg|gif|webp)$/.test(meta.content_type)) {
    return (
      <figure className="artifact">
        <img src={url} alt={`Artifact ${meta.name}`} />
        <figcaption>
          <a href={url} download={meta.name}>
            Download {meta.name}
          </a>
        </figcaption>
      </figure>
    );
  }
  return (
    <p className="artifact">
      <a href={url} download={meta.name}>
        Download {meta.name} ({meta.size_bytes} bytes)
      </a>
    </p>
  );
}
