//! Derive macros for pipewright, re-exported by `pipewright-kernels` (and so by `pipewright`)
//! beside the traits they implement:
//!
//! - `#[derive(Parameters)]` with `#[parameters(a, b.inner, c)]`: a layer's parameter visit
//!   as its parts' visits, in the order listed (that order is the flat order of gradients
//!   and optimizer state). A part is anything that implements `Parameters`: a `Param`, a
//!   kernels layer, an `Option`, `Vec` or `Box` of them. `tensor = B::Storage` names the
//!   tensor type of a backend-generic layer (the host `Tensor` by default). A field left out
//!   of the list whose type holds parameters (implements `Parameters`) does not compile: its
//!   parameters would never be stepped or reduced over replicas. Mark a field that is
//!   meant to stay out (a frozen layer) `#[parameters(skip)]`.
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
use proc_macro_crate::{crate_name, FoundCrate};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Fields, Ident, Token, Type};

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

/// One item of `#[parameters(..)]`: the tensor type, or a part (a field path).
enum Item {
    Tensor(Type),
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
            return Ok(Item::Tensor(input.parse()?));
        }
        Ok(Item::Part(Punctuated::parse_separated_nonempty(input)?))
    }
}

fn parameters(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "Parameters derives for structs",
        ));
    };
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
                Item::Tensor(t) => tensor = Some(t),
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
    let unlisted = unlisted(input, data, &parts, &krate, &tensor)?;
    Ok(quote! {
        impl #impl_g #params for #name #ty_g #where_g {
            fn visit(&self, f: &mut dyn FnMut(&#param)) {
                #( <_ as #params>::visit(&self.#parts, f); )*
            }
            fn visit_mut(&mut self, f: &mut dyn FnMut(&mut #param)) {
                #( <_ as #params>::visit_mut(&mut self.#parts, f); )*
            }
        }
        #unlisted
    })
}

/// A check that no field left out of `#[parameters(..)]` (and not marked
/// `#[parameters(skip)]`) holds parameters: a type that implements `Parameters` makes the
/// two impls below both apply, which does not compile, and the error names the trait
/// `FieldHoldsParametersListItOrMarkItSkip` at the field's type.
fn unlisted(
    input: &DeriveInput,
    data: &syn::DataStruct,
    parts: &[Punctuated<Ident, Token![.]>],
    krate: &Tokens,
    tensor: &Tokens,
) -> syn::Result<Tokens> {
    let listed: Vec<String> = parts
        .iter()
        .filter_map(|p| p.first().map(ToString::to_string))
        .collect();
    let mut checks = Vec::new();
    for field in &data.fields {
        let mut skip = false;
        for attr in field
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("parameters"))
        {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                    Ok(())
                } else {
                    Err(meta.error("expected #[parameters(skip)] on a field"))
                }
            })?;
        }
        let named_listed = field
            .ident
            .as_ref()
            .is_some_and(|id| listed.contains(&id.to_string()));
        if skip || named_listed {
            continue;
        }
        let ty = &field.ty;
        checks.push(quote_spanned! {ty.span()=>
            let _ = <#ty as FieldHoldsParametersListItOrMarkItSkip<#tensor, _>>::check;
        });
    }
    if checks.is_empty() {
        return Ok(quote!());
    }
    let shaped = quote!(#krate::Shaped);
    let params = quote!(#krate::layers::Parameters);
    let name = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    Ok(quote! {
        const _: () = {
            trait FieldHoldsParametersListItOrMarkItSkip<S, A> {
                fn check() {}
            }
            impl<S, T: ?Sized> FieldHoldsParametersListItOrMarkItSkip<S, ()> for T {}
            struct HoldsParameters;
            impl<S: #shaped, T: ?Sized + #params<S>>
                FieldHoldsParametersListItOrMarkItSkip<S, HoldsParameters> for T {}
            impl #impl_g #name #ty_g #where_g {
                #[allow(dead_code)]
                fn __pipewright_unlisted_fields_hold_no_parameters() {
                    #( #checks )*
                }
            }
        };
    })
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
        let mut skip = false;
        for attr in field
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("footprint"))
        {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    skip = true;
                    Ok(())
                } else {
                    Err(meta.error("expected #[footprint(skip)]"))
                }
            })?;
        }
        if skip {
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
    match crate_name("pipewright-kernels") {
        Ok(FoundCrate::Itself) => return own("pipewright-kernels", quote!()),
        Ok(FoundCrate::Name(n)) => return named(n, quote!()),
        Err(_) => {}
    }
    match crate_name("pipewright") {
        Ok(FoundCrate::Itself) => own("pipewright", quote!(::kernels)),
        Ok(FoundCrate::Name(n)) => named(n, quote!(::kernels)),
        // Neither named in Cargo.toml (a renamed or vendored kernels): the usual name.
        Err(_) => quote!(::pipewright_kernels),
    }
}
