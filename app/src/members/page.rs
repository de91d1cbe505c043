//! `/members`: the tenant's people. Everyone in the tenant sees who is in it; owners also invite
//! (the one-time link is shown once, here, for the owner to send), change roles, remove members
//! and withdraw pending invitations. The server functions check the role again.

use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    list_members, CancelInvitation, ChangeRole, FreshInvitation, InvitationView, InviteMember,
    MemberView, MembersView, RemoveMember, INVITATION_DAYS,
};
use crate::frame::{framed, CopyButton, CopyScript, CsrfField, Guarded, NARROW};
use crate::model::{Access, PageState};
use crate::PRODUCT;

/// Roles as forms offer them: stored spelling and label.
const ROLES: [(&str, &str); 3] = [
    ("owner", "Owner"),
    ("member", "Member"),
    ("read_only", "Read-only"),
];

fn label(role: &str) -> &'static str {
    ROLES
        .iter()
        .find(|(v, _)| *v == role)
        .map_or("?", |(_, l)| *l)
}

#[component]
pub fn MembersPage() -> impl IntoView {
    view! {
        <Title text=format!("Members · {PRODUCT}")/>
        <Guarded access=Access::Tenant content=page/>
    }
}

fn page(state: PageState) -> AnyView {
    framed(state, NARROW, "Members", list_members(), body)
}

fn body(v: MembersView, csrf: String) -> AnyView {
    let manage = v.can_manage;
    let rows = {
        let csrf = csrf.clone();
        v.members
            .into_iter()
            .map(|m| member_row(m, manage, csrf.clone()))
            .collect_view()
    };
    let owner_panels = manage.then(|| {
        view! {
            {v.fresh.map(fresh_panel)}
            {invite_panel(csrf.clone())}
            {pending_panel(v.invitations, csrf)}
        }
    });
    view! {
        <section class="panel">
            <h2>"People in this tenant"</h2>
            <table class="list members">
                <thead>
                    <tr>
                        <th>"Email"</th>
                        <th>"Name"</th>
                        <th>"Role"</th>
                        <th>"Since"</th>
                        <th><span class="visually-hidden">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            <p class="muted">
                "Owners manage members, settings and request-body logging; members manage API \
                 keys; read-only users see the pages and change nothing."
            </p>
        </section>
        {owner_panels}
    }
    .into_any()
}

fn member_row(m: MemberView, manage: bool, csrf: String) -> AnyView {
    let role = label(&m.role);
    let who = if m.me {
        format!("{} (you)", m.email)
    } else {
        m.email.clone()
    };
    let actions = manage.then(|| {
        let role_form = ServerAction::<ChangeRole>::new();
        let remove = ServerAction::<RemoveMember>::new();
        let current = m.role.clone();
        let (csrf2, id2, email2) = (csrf.clone(), m.id.clone(), m.email.clone());
        let aria = format!("Role of {}", m.email);
        view! {
            <details class="confirm">
                <summary>"Change role…"</summary>
                <ActionForm action=role_form>
                    <CsrfField token=csrf/>
                    <input type="hidden" name="user" value=m.id.clone()/>
                    <select name="role" aria-label=aria>
                        {ROLES
                            .iter()
                            .map(|(v, l)| {
                                let selected = *v == current;
                                view! { <option value=*v selected=selected>{*l}</option> }
                            })
                            .collect_view()}
                    </select>
                    <button type="submit">"Change role"</button>
                </ActionForm>
            </details>
            <details class="confirm">
                <summary>"Remove…"</summary>
                <ActionForm action=remove>
                    <CsrfField token=csrf2/>
                    <input type="hidden" name="user" value=id2/>
                    <p>"Remove " {email2} "? Their account and sessions end now."</p>
                    <button type="submit" class="danger">"Remove member"</button>
                </ActionForm>
            </details>
        }
    });
    view! {
        <tr>
            <td>{who}</td>
            <td>{m.display_name}</td>
            <td>{role}</td>
            <td>{m.since}</td>
            <td class="actions">{actions}</td>
        </tr>
    }
    .into_any()
}

fn fresh_panel(f: FreshInvitation) -> AnyView {
    view! {
        <section class="panel secret" aria-live="polite">
            <h2>"Invitation for " {f.email}</h2>
            <p>
                <strong>"Send this link to them now: it is shown only once."</strong>
                " It works once, for " {INVITATION_DAYS} " days, and joins them as "
                {label(&f.role)} "."
            </p>
            <div class="secret-line">
                <code id="invite-link" class="secret-value">{f.link}</code>
                <CopyButton target="invite-link".to_owned()/>
            </div>
            <CopyScript/>
        </section>
    }
    .into_any()
}

fn invite_panel(csrf: String) -> AnyView {
    let invite = ServerAction::<InviteMember>::new();
    view! {
        <section class="panel">
            <h2>"Invite someone"</h2>
            <ActionForm action=invite attr:class="inline">
                <CsrfField token=csrf/>
                <label for="invite-email">"Email"</label>
                <input id="invite-email" type="email" name="email" maxlength="254" required/>
                <label for="invite-role">"Role"</label>
                <select id="invite-role" name="role">
                    {ROLES
                        .iter()
                        .map(|(v, l)| {
                            let selected = *v == "member";
                            view! { <option value=*v selected=selected>{*l}</option> }
                        })
                        .collect_view()}
                </select>
                <button type="submit">"Make invitation link"</button>
            </ActionForm>
        </section>
    }
    .into_any()
}

fn pending_panel(invitations: Vec<InvitationView>, csrf: String) -> AnyView {
    if invitations.is_empty() {
        return ().into_any();
    }
    view! {
        <section class="panel">
            <h2>"Pending invitations"</h2>
            <table class="list">
                <thead>
                    <tr>
                        <th>"Email"</th>
                        <th>"Role"</th>
                        <th>"Link works until"</th>
                        <th><span class="visually-hidden">"Actions"</span></th>
                    </tr>
                </thead>
                <tbody>
                    {invitations
                        .into_iter()
                        .map(|i| {
                            let cancel = ServerAction::<CancelInvitation>::new();
                            let csrf = csrf.clone();
                            view! {
                                <tr>
                                    <td>{i.email}</td>
                                    <td>{label(&i.role)}</td>
                                    <td>{i.expires}</td>
                                    <td class="actions">
                                        <ActionForm action=cancel>
                                            <CsrfField token=csrf/>
                                            <input type="hidden" name="invitation" value=i.id/>
                                            <button type="submit" class="secondary">"Withdraw"</button>
                                        </ActionForm>
                                    </td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </section>
    }
    .into_any()
}
