// Small DOM helpers and the shared error banner.

/** `el("button", {type: "button", onclick}, "text", child…)`. */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** A labelled control: `<label>text <input …></label>`. */
export function field(text, control) {
  return el("label", {}, text, control);
}

/** Shows an error as the API said it (or clears the banner with null). */
export function showError(error) {
  const banner = document.getElementById("error");
  if (!error) {
    banner.hidden = true;
    banner.textContent = "";
    return;
  }
  console.info("fanline console:", error.message);
  banner.textContent = error.message;
  banner.hidden = false;
}

/** Runs `action`, showing what it throws; resolves to its result or undefined. */
export async function attempt(action) {
  try {
    const result = await action();
    showError(null);
    return result;
  } catch (error) {
    showError(error);
    return undefined;
  }
}

export function when(at) {
  const date = new Date(at);
  return Number.isNaN(date.getTime()) ? at : date.toLocaleString();
}

export function payloadText(payload) {
  if (payload && typeof payload === "object" && typeof payload.text === "string") {
    return payload.text;
  }
  return JSON.stringify(payload, null, 2);
}

/**
 * The small "edited" mark of an item past its first version (null before): the edit's time
 * is its tooltip and its `datetime`.
 */
export function editedMark(item) {
  if (!item || !(item.version > 1)) return null;
  if (!item.edited_at) return el("span", { class: "edited" }, "edited");
  return el("time", { class: "edited", datetime: item.edited_at, title: `edited ${when(item.edited_at)}` }, "edited");
}
