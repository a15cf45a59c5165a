// Files in the chat (T21, T26). Before sending: each file attached (the button, a drop on
// the chat, a paste) is uploaded at once to POST /v1/chats/{id}/files, shown as a thumbnail
// (an image, through an object URL) or a name chip, and removable; a file the brain refuses
// shows why beside it and is never sent. The message then carries `file` parts naming the
// uploaded files by the URLs the brain answered. In the transcript a `file` part shows
// inline (an image) or as a download link, through its signed URL: no key is needed, so a
// plain <img src> works, as it does for the stock useChat.

import { useEffect, useRef, useState } from "react";
import type { FileUIPart } from "ai";
import { type Api, ApiError, type ChatFile, explain, isFileUrl } from "./api";

export interface Attachment {
  key: string;
  name: string;
  /** An object URL of the picked file, for the thumbnail of an image. */
  preview?: string;
  state: "uploading" | "ready" | "refused";
  stored?: ChatFile;
  problem?: string;
}

/** The attachments of the message being written, and what changes them. */
export function useAttachments(api: Api, chatId: string) {
  const [items, setItems] = useState<Attachment[]>([]);
  const counter = useRef(0);
  const live = useRef(items);
  live.current = items;
  // Object URLs are freed with the chat view.
  useEffect(() => () => live.current.forEach((a) => a.preview && URL.revokeObjectURL(a.preview)), []);

  const update = (key: string, change: Partial<Attachment>) =>
    setItems((all) => all.map((a) => (a.key === key ? { ...a, ...change } : a)));

  function add(files: Iterable<File>) {
    for (const file of files) {
      const key = `f${counter.current++}`;
      const preview = /^image\/(png|jpeg|gif|webp)$/.test(file.type) ? URL.createObjectURL(file) : undefined;
      setItems((all) => [...all, { key, name: file.name || "pasted file", preview, state: "uploading" }]);
      api.uploadFile(chatId, file).then(
        (stored) => update(key, { state: "ready", stored }),
        (err) =>
          update(key, {
            state: "refused",
            problem: err instanceof ApiError ? `${err.code}: ${explain(err)}` : "the file could not be uploaded",
          }),
      );
    }
  }

  // A file removed after its upload stays stored in the chat (and goes with it), unsent.
  function remove(key: string) {
    const gone = items.find((a) => a.key === key);
    if (gone?.preview) URL.revokeObjectURL(gone.preview);
    setItems((all) => all.filter((a) => a.key !== key));
  }

  /** The `file` parts of the files the brain took; the list is emptied. */
  function take(): FileUIPart[] {
    const parts = items
      .filter((a) => a.state === "ready" && a.stored)
      .map((a) => ({ type: "file" as const, mediaType: a.stored!.media_type, filename: a.stored!.filename, url: a.stored!.url }));
    items.forEach((a) => a.preview && URL.revokeObjectURL(a.preview));
    setItems([]);
    return parts;
  }

  return {
    items,
    add,
    remove,
    take,
    uploading: items.some((a) => a.state === "uploading"),
    ready: items.some((a) => a.state === "ready"),
  };
}

/** The attachments before sending: thumbnails and chips, each removable, a refusal beside
 * its file. */
export function PendingFiles({ items, onRemove }: { items: Attachment[]; onRemove: (key: string) => void }) {
  if (items.length === 0) return null;
  return (
    <ul className="pending-files" aria-label="Attached files">
      {items.map((a) => (
        <li key={a.key} className={`pending-file ${a.state}`}>
          {a.preview ? <img src={a.preview} alt={a.name} className="thumb" /> : <span className="chip">{a.name}</span>}
          {a.preview && <span className="name">{a.name}</span>}
          {a.state === "uploading" && <span className="status">uploading…</span>}
          {a.state === "refused" && (
            <span className="refused" role="alert">
              Not sent: {a.problem}
            </span>
          )}
          <button type="button" className="link" aria-label={`Remove ${a.name}`} onClick={() => onRemove(a.key)}>
            Remove
          </button>
        </li>
      ))}
    </ul>
  );
}

/** A `file` part of the transcript: an image inline, anything else a download link. Only
 * this brain's file URLs are shown; any other is named, never followed. */
export function FilePart({ url, mediaType, filename }: { url?: string; mediaType?: string; filename?: string }) {
  const name = filename || "file";
  if (!isFileUrl(url)) return <p className="file">Attached: {name}</p>;
  if (/^image\/(png|jpeg|gif|webp)$/.test(mediaType ?? "")) {
    return (
      <figure className="file">
        <a href={url} target="_blank" rel="noopener noreferrer">
          <img src={url} alt={name} />
        </a>
      </figure>
    );
  }
  return (
    <p className="file">
      <a href={url} download={name}>
        {name}
      </a>{" "}
      <small>({mediaType})</small>
    </p>
  );
}
