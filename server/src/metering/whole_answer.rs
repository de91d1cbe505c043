//! A whole answer read from a metered stream: the client asked for one JSON answer, the engine
//! streamed (every generating request streams upstream, issue 31). Kept apart from the assemblers
//! so that they know nothing of the stream that feeds them.

use bytes::Bytes;
use futures::StreamExt;

use super::assemble::{Assembler, Failure, Shape};
use super::assemble_typed::TypedAssembler;
use super::sse::SseParser;
use super::stream::{EngineBody, MeteredStream};

/// Reads a metered stream to its end and assembles the answer. Dropping this future (the client
/// hung up) drops the stream, whose `Drop` cancels the engine and bills what it produced.
///
/// A chunk stream's meter assembles as it meters ([`StreamMeter::assembling`]), so the stream
/// yields only its end: `[DONE]`, or the error event of a stream that broke, read here. A typed
/// stream (Responses, Anthropic) yields its events, assembled here.
///
/// [`StreamMeter::assembling`]: super::meter::StreamMeter::assembling
pub async fn collect<B: EngineBody>(
    mut stream: MeteredStream<B>,
    shape: Shape,
) -> Result<Bytes, Failure> {
    let mut parser = SseParser::default();
    let mut typed = match shape {
        Shape::Typed(dialect) => Some(TypedAssembler::new(dialect)),
        Shape::Chat | Shape::Text => None,
    };
    // The end events of a chunk stream (an error event names why it broke).
    let mut ends = Vec::new();
    let mut broken = false;
    while let Some(bytes) = stream.next().await {
        let Ok(bytes) = bytes else {
            broken = true;
            break;
        };
        parser.push(bytes);
        while let Some(event) = parser.next_event() {
            push_data(event.data, typed.as_mut(), &mut ends);
        }
    }
    if let Some(event) = parser.finish() {
        push_data(event.data, typed.as_mut(), &mut ends);
    }
    let assembled = match typed {
        Some(typed) => typed.finish(),
        None => {
            // A hang-up or a cut took the meter (and its assembler) to record the event: the
            // end event then says why there is no answer.
            let mut chunks = stream
                .take_assembler()
                .unwrap_or_else(|| Assembler::new(shape));
            for data in &ends {
                chunks.push(data);
            }
            chunks.finish()
        }
    };
    drop(stream);
    match assembled {
        Ok(body) if !broken => Ok(Bytes::from(body)),
        Ok(_) => Err(Failure::Broken),
        Err(e) => Err(e),
    }
}

/// One event's data: to the typed assembler, or kept as a chunk stream's end.
fn push_data(data: Option<Bytes>, typed: Option<&mut TypedAssembler>, ends: &mut Vec<Bytes>) {
    let Some(data) = data else { return };
    match typed {
        Some(typed) => typed.push(&data),
        None => ends.push(data),
    }
}
