//! Derive macros for pipewright, re-exported by `pipewright-kernels` (and so by `pipewright`)
//! beside the traits they implement:
//!
//! - `#[derive(Parameters)]` with `#[parameters(a, b.inner, c)]`: a layer's parameter visit
//!   as its parts' visits, in the order listed (that order is the flat order of gradients
//!   and optimizer state). A part is anything that implements `Parameters`: a `Param`, a
//!   kernels layer, an `Option`, `Vec` or `Box` of them. `tensor = B::Storage` names the
//!   tensor type of a backend-generic layer (the host `Tensor` by default). A field whose
//!   type holds parameters but is not listed does not compile (its weights would never be
//!   trained); `#[parameters(skip)]` on the field says it is frozen on purpose. (Checked for
//!   fields of concrete types: a field whose type names the struct's generic parameters is
//!   not.)
//! - `#[derive(Footprint)]`: a stash's bytes as the sum of its fields' (each a `Footprint`);
//!   `#[footprint(skip)]` leaves out a field that holds no stashed memory (a flag).
//!
//! ```ignore
//! use pipewright::kernels::layers::{LayerNorm, Linear, Parameters};
//!
//! #[derive(Parameters)]
//! #[parameters(norm, lin)]
//! struct Residual {
//!     norm: LayerNorm,
//!     lin: Linear,
//!     scale: f32, // not a parameter: not listed
//! }
//! ```

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, Ident, Token, Type};

use manifest::{Found, Manifest};

mod manifest;

/// `#[derive(Parameters)]`: see the crate docs.
#[proc_macro_derive(Parameters, attributes(parameters))]
pub fn derive_parameters(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    parameters(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// `#[derive(Footprint)]`: see the crate docs.
#[proc_macro_derive(Footprint, attributes(footprint))]
pub fn derive_footprint(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    footprint(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// One item of `#[parameters(..)]`: the tensor type (boxed: syn 3's `Type` is large), or a
/// part (a field path).
enum Item {
    Tensor(Box<Type>),
    Part(Punctuated<Ident, Token![.]>),
}

impl Parse for Item {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Ident) && input.peek2(Token![=]) {
            let key: Ident = input.parse()?;
            if key != "tensor" {
                return Err(syn::Error::new(
                    key.span(),
                    "expected `tensor = Type` or a field",
                ));
            }
            input.parse::<Token![=]>()?;
            return Ok(Item::Tensor(Box::new(input.parse()?)));
        }
        Ok(Item::Part(Punctuated::parse_separated_nonempty(input)?))
    }
}

fn parameters(input: &DeriveInput) -> syn::Result<Tokens> {
    if !matches!(input.data, Data::Struct(_)) {
        return Err(syn::Error::new_spanned(
            input,
            "Parameters derives for structs",
        ));
    }
    let krate = kernels();
    let mut tensor: Option<Type> = None;
    let mut parts = Vec::new();
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("parameters"))
    {
        let items = attr.parse_args_with(Punctuated::<Item, Token![,]>::parse_terminated)?;
        for item in items {
            match item {
                Item::Tensor(t) => tensor = Some(*t),
                Item::Part(p) => parts.push(p),
            }
        }
    }
    if parts.is_empty() {
        let msg = "list the fields that hold parameters, in order: #[parameters(a, b)] \
                   (a layer without parameters implements Parameters with empty visits)";
        return Err(syn::Error::new_spanned(&input.ident, msg));
    }
    let tensor = tensor.map_or_else(|| quote!(#krate::Tensor), |t| quote!(#t));
    let name = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let params = quote!(#krate::layers::Parameters<#tensor>);
    let param = quote!(#krate::layers::Param<#tensor>);
    let unlisted = unlisted_checks(input, &parts, &tensor, &params)?;
    Ok(quote! {
        #unlisted
        impl #impl_g #params for #name #ty_g #where_g {
            fn visit(&self, f: &mut dyn FnMut(&#param)) {
                #( <_ as #params>::visit(&self.#parts, f); )*
            }
            fn visit_mut(&mut self, f: &mut dyn FnMut(&mut #param)) {
                #( <_ as #params>::visit_mut(&mut self.#parts, f); )*
            }
        }
    })
}

/// A compile error for each field that holds parameters but is neither listed nor marked
/// `#[parameters(skip)]`: its weights would get gradients that no optimizer step or
/// data-parallel reduction ever reads, and the model would train with them frozen, silently.
///
/// Whether a field's type implements `Parameters` is asked at compile time by the inherent
/// const of a probe type (chosen only where the bound holds) over a trait's default. That
/// resolves for concrete types only, so a field whose type names the struct's own generic
/// parameters is not checked.
fn unlisted_checks(
    input: &DeriveInput,
    parts: &[Punctuated<Ident, Token![.]>],
    tensor: &Tokens,
    params: &Tokens,
) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Ok(Tokens::new());
    };
    let listed: Vec<&Ident> = parts.iter().filter_map(|p| p.first()).collect();
    let generics: Vec<String> = input
        .generics
        .params
        .iter()
        .map(|g| match g {
            syn::GenericParam::Type(t) => t.ident.to_string(),
            syn::GenericParam::Lifetime(l) => l.lifetime.ident.to_string(),
            syn::GenericParam::Const(c) => c.ident.to_string(),
        })
        .collect();
    if mentions(tensor, &generics) {
        // A backend-generic layer (`tensor = B::Storage`): nothing concrete to ask about.
        return Ok(Tokens::new());
    }
    let mut asserts = Vec::new();
    for field in &data.fields {
        let Some(id) = &field.ident else { continue };
        let ty = &field.ty;
        if listed.contains(&id)
            || skipped(field, "parameters")?
            || mentions(&quote!(#ty), &generics)
        {
            continue;
        }
        let message = format!(
            "field `{id}` of `{}` holds parameters but is not in #[parameters(..)]: its \
             weights would never be stepped or reduced over data-parallel replicas; list it, \
             or mark it #[parameters(skip)] if it is frozen",
            input.ident
        );
        asserts.push(quote_spanned!(ty.span()=> assert!(!<Probe<#ty>>::HOLDS, #message);));
    }
    if asserts.is_empty() {
        return Ok(Tokens::new());
    }
    Ok(quote! {
        const _: () = {
            struct Probe<T: ?Sized>(::core::marker::PhantomData<T>);
            trait Fallback { const HOLDS: bool = false; }
            impl<T: ?Sized> Fallback for Probe<T> {}
            #[allow(dead_code)]
            impl<T: ?Sized + #params> Probe<T> { const HOLDS: bool = true; }
            #( #asserts )*
        };
    })
}

/// Whether a field says `#[<attr>(skip)]` (`parameters` or `footprint`).
fn skipped(field: &syn::Field, attr: &str) -> syn::Result<bool> {
    let mut skip = false;
    for a in field.attrs.iter().filter(|a| a.path().is_ident(attr)) {
        a.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error(format!("expected #[{attr}(skip)] on a field")))
            }
        })?;
    }
    Ok(skip)
}

/// Whether tokens (a type) name any of `generics` (by identifier, anywhere in them).
fn mentions(ty: &Tokens, generics: &[String]) -> bool {
    fn walk(tokens: Tokens, generics: &[String]) -> bool {
        tokens.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => generics.iter().any(|g| i == g),
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), generics),
            _ => false,
        })
    }
    !generics.is_empty() && walk(ty.clone(), generics)
}

fn footprint(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "Footprint derives for structs",
        ));
    };
    let krate = kernels();
    let trait_ = quote!(#krate::footprint::Footprint);
    let mut sum = Vec::new();
    for (i, field) in data.fields.iter().enumerate() {
        if skipped(field, "footprint")? {
            continue;
        }
        let access = match (&field.ident, &data.fields) {
            (Some(id), _) => quote!(#id),
            (None, Fields::Unnamed(_)) => {
                let index = syn::Index::from(i);
                quote!(#index)
            }
            (None, _) => unreachable!("a field without a name is in a tuple struct"),
        };
        sum.push(quote!(#trait_::bytes(&self.#access)));
    }
    let name = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_g #trait_ for #name #ty_g #where_g {
            fn bytes(&self) -> usize {
                0 #( + #sum )*
            }
        }
    })
}

/// The path of the kernels crate as the deriving crate names it.
fn kernels() -> Tokens {
    let own = |pkg: &str, suffix: Tokens| {
        // Inside the package's own library `crate`; in its tests, examples and benches
        // (other crates of the package) its name.
        let lib = pkg.replace('-', "_");
        let in_lib = std::env::var("CARGO_CRATE_NAME").is_ok_and(|c| c == lib)
            && std::env::var_os("CARGO_BIN_NAME").is_none();
        let id = Ident::new(&lib, Span::call_site());
        if in_lib {
            quote!(crate #suffix)
        } else {
            quote!(::#id #suffix)
        }
    };
    let named = |name: String, suffix: Tokens| {
        let id = Ident::new(&name, Span::call_site());
        quote!(::#id #suffix)
    };
    // A manifest that cannot be read names nothing: the usual name below.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
    let manifest = dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("Cargo.toml")).ok())
        .unwrap_or_default();
    let manifest = Manifest::read(&manifest, || dir.as_deref().and_then(workspace_manifest));
    match manifest.find("pipewright-kernels") {
        Some(Found::Itself) => return own("pipewright-kernels", quote!()),
        Some(Found::Name(n)) => return named(n, quote!()),
        None => {}
    }
    match manifest.find("pipewright") {
        Some(Found::Itself) => own("pipewright", quote!(::kernels)),
        Some(Found::Name(n)) => named(n, quote!(::kernels)),
        // Neither named in Cargo.toml (a vendored kernels): the usual name.
        None => quote!(::pipewright_kernels),
    }
}

/// The manifest of the workspace `dir`'s package belongs to: the nearest `Cargo.toml` at or
/// above `dir` with a `[workspace]` table.
fn workspace_manifest(dir: &std::path::Path) -> Option<String> {
    dir.ancestors()
        .filter_map(|d| std::fs::read_to_string(d.join("Cargo.toml")).ok())
        .find(|text| text.lines().any(|l| l.trim() == "[workspace]"))
}
