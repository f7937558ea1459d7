// A confirmation before every destructive action: a modal that says in words what will happen, with the
// harmless choice focused, so Enter, Escape or a click outside the buttons leave everything as it was.
import { h } from "./api.js";

let pending = null; // the open confirmation's resolver: a second one first answers the first with "no"

// Resolves true only when the operator presses the confirming button.
export function confirmAction({ title, body, confirm, keep = "Cancel" }) {
  const dialog = document.getElementById("confirm-dialog");
  if (pending) pending(false);
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-body").replaceChildren(...[body].flat().map((p) => h("p", {}, p)));
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  ok.textContent = confirm;
  cancel.textContent = keep;
  return new Promise((resolve) => {
    const answer = (yes) => {
      if (pending !== answer) return;
      pending = null;
      ok.removeEventListener("click", yesClick);
      cancel.removeEventListener("click", noClick);
      dialog.removeEventListener("cancel", noClick);
      if (dialog.open) dialog.close();
      resolve(yes);
    };
    const yesClick = () => answer(true);
    const noClick = (event) => { event.preventDefault(); answer(false); };
    pending = answer;
    ok.addEventListener("click", yesClick);
    cancel.addEventListener("click", noClick);
    dialog.addEventListener("cancel", noClick); // Escape
    dialog.showModal();
    cancel.focus(); // the default: Enter keeps things as they are
  });
}
